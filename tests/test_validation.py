import pytest

from tensorfleet.validation import positive_int


def test_positive_int_returns_the_value() -> None:
    assert positive_int("n", 3) == 3


@pytest.mark.parametrize("value", [0, -2, 1.0, True, "3", None])
def test_positive_int_names_the_bad_value(value) -> None:
    with pytest.raises(ValueError) as info:
        positive_int("n", value)
    assert str(info.value) == f"n must be a positive integer. Received: n={value!r}"


def test_choice_takes_members_and_names_in_any_case_and_lists_the_choices() -> None:
    from tensorfleet.cluster.k8s import RestartPolicy
    from tensorfleet.validation import choice

    assert choice(RestartPolicy, "restart_policy", " onfailure ") is RestartPolicy("OnFailure")
    assert choice(RestartPolicy, "restart_policy", RestartPolicy("Never")) is RestartPolicy("Never")
    for bad in ("Sometimes", 3, None):
        with pytest.raises(ValueError) as info:
            choice(RestartPolicy, "restart_policy", bad)
        assert str(info.value) == ("restart_policy must be one of 'Always', 'OnFailure', 'Never', 'ExitCode'. "
                                   f"Received: restart_policy={bad!r}")
