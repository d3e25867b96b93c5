import pytest

from tensorfleet.validation import positive_int


def test_positive_int_returns_the_value() -> None:
    assert positive_int("n", 3) == 3


@pytest.mark.parametrize("value", [0, -2, 1.0, True, "3", None])
def test_positive_int_names_the_bad_value(value) -> None:
    with pytest.raises(ValueError) as info:
        positive_int("n", value)
    assert str(info.value) == f"n must be a positive integer. Received: n={value!r}"
