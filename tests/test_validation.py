import pytest

from tensorfleet.validation import boolean, positive_int


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


@pytest.mark.parametrize(
    "parse,text,message",
    [
        ("parse_bandwidth", "100", "A bandwidth needs a unit, such as '100Gbps'. Received: '100'"),
        ("parse_bytes", " 16 ", "A memory size needs a unit, such as '16GB'. Received: ' 16 '"),
        ("parse_duration", "5", "A latency needs a unit, such as '5us'. Received: '5'"),
    ],
)
def test_require_unit_refuses_a_bare_number_string(parse, text, message) -> None:
    from tensorfleet import validation

    with pytest.raises(ValueError) as info:
        getattr(validation, parse)(text, require_unit=True)
    assert str(info.value) == message


def test_without_require_unit_bare_strings_and_numbers_keep_their_base_unit() -> None:
    from tensorfleet.validation import parse_bandwidth, parse_bytes, parse_duration

    assert (parse_bandwidth("100"), parse_bytes("16"), parse_duration("5")) == (100.0, 16.0, 5.0)
    # A Python number is explicit about its unit (bytes/s, bytes, seconds) even with require_unit.
    assert parse_bandwidth(12.5e9, require_unit=True) == 12.5e9
    assert parse_bytes(1024, require_unit=True) == 1024.0
    assert parse_duration(5e-6, require_unit=True) == 5e-6
    assert parse_bandwidth("100Gbps", require_unit=True) == 12.5e9


@pytest.mark.parametrize("value", ["no", "true", 1, 0, None, 1.0])
def test_boolean_takes_only_a_bool(value):
    with pytest.raises(ValueError) as excinfo:
        boolean("progress", value)
    assert str(excinfo.value) == f"progress must be true or false. Received: progress={value!r}"
    assert boolean("progress", False) is False


def test_a_renamed_keyword_keeps_working_with_a_warning_naming_the_new_one():
    import warnings

    from tensorfleet.validation import renamed

    @renamed(arena_size="arena_bytes")
    def probe(model, *, arena_bytes=None):
        return arena_bytes

    with pytest.warns(DeprecationWarning, match=r"^.*probe: 'arena_size' is now 'arena_bytes'; the older name will "
                                                r"stop working in the next release\.$") as seen:
        assert probe(b"", arena_size=4096) == 4096
    assert seen[0].filename == __file__  # the warning points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert probe(b"", arena_bytes=2048) == 2048
    with pytest.raises(ValueError, match=r"'arena_size' is the older name of 'arena_bytes'; give one of them\. "
                                         r"Received: arena_size=1, arena_bytes=2$"):
        probe(b"", arena_size=1, arena_bytes=2)
    with pytest.raises(TypeError, match=r"renamed\(log='sink'\) does not fit"):
        renamed(log="sink")(probe.__wrapped__)
