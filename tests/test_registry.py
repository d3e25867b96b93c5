import pytest

from tensorfleet.registry import Registry, UnknownNameError


def make() -> Registry[int]:
    reg: Registry[int] = Registry("colour")
    reg.register("red", 1, description="warm", aliases=("r", "crimson"))
    reg.register("blue", 2)
    return reg


def test_lookup_by_name_alias_and_case() -> None:
    reg = make()
    assert reg.get("red") == 1
    assert reg.get("Crimson") == 1
    assert reg.get(" BLUE ") == 2
    assert reg.canonical("r") == "red"
    assert reg.names() == ["red", "blue"]
    assert "crimson" in reg and "green" not in reg and 3 not in reg


def test_unknown_name_lists_available_names_and_suggests_closest() -> None:
    with pytest.raises(UnknownNameError) as info:
        make().get("bleu")
    assert str(info.value) == "Unknown colour 'bleu'. Did you mean 'blue'? Available: red, blue."
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_unknown_name_without_close_match_has_no_suggestion() -> None:
    with pytest.raises(UnknownNameError, match=r"^Unknown colour 'zzzzzz'\. Available: red, blue\.$"):
        make().get("zzzzzz")


def test_duplicate_registration_is_refused() -> None:
    reg = make()
    with pytest.raises(ValueError, match="A colour named 'red' is already registered"):
        reg.register("red", 3)
    with pytest.raises(ValueError, match="The alias 'r' of colour 'rouge' is already taken"):
        reg.register("rouge", 3, aliases=("r",))
    reg.register("red", 5, override=True)
    assert reg.get("red") == 5


def test_empty_and_non_string_names_are_refused() -> None:
    reg = make()
    with pytest.raises(ValueError, match="must be a non-empty string. Received: name=''"):
        reg.register("", 1)
    with pytest.raises(TypeError, match=r"must be a string. Received: 3 \(int\)"):
        reg.get(3)  # type: ignore[arg-type]


def test_unregister_removes_the_entry_and_its_aliases_and_names_unknown_ones() -> None:
    reg: Registry[int] = Registry("colour")
    reg.register("red", 1, aliases=("r", "rouge"))
    reg.register("blue", 2)
    assert reg.unregister("Rouge") == 1
    assert (reg.names(), "r" in reg, "rouge" in reg) == (["blue"], False, False)
    reg.register("red", 3, aliases=("r",))  # the name and its alias are free again
    assert reg.get("r") == 3
    with pytest.raises(UnknownNameError, match=r"Unknown colour 'green'. Did you mean 'red'\? Available: blue, red."):
        reg.unregister("green")
