"""ClusterSpec: two tasks on one machine's address and one port are one task, however the host is spelt."""

from __future__ import annotations

import re

import pytest

from tensorfleet.strategies.tf_config import ClusterSpec, TFConfigError, parse_tf_config


@pytest.mark.parametrize(("first", "second", "same"), [
    ("localhost:2222", "127.0.0.1:2222", "loopback addresses"),
    ("127.0.0.1:2222", "[::1]:2222", "loopback addresses"),
    ("LOCALHOST:2222", "localhost:2222", "loopback addresses"),
    ("[::ffff:10.0.0.5]:2222", "10.0.0.5:2222", "10.0.0.5"),
])
def test_two_spellings_of_one_host_and_port_are_rejected(first: str, second: str, same: str) -> None:
    with pytest.raises(TFConfigError) as info:
        ClusterSpec({"worker": [first, second]})
    assert str(info.value) == (
        f"Two tasks share one address: worker:0 at {first!r} and worker:1 at {second!r} are the same host "
        f"({same}) and port. Every task needs its own host:port.")


def test_the_check_holds_across_roles_in_a_tf_config() -> None:
    with pytest.raises(TFConfigError, match=r"^Two tasks share one address: worker:0 at 'localhost:2222' and ps:0 at "
                                            r"'127\.0\.0\.1:2222' are the same host \(loopback addresses\)"):
        parse_tf_config({"cluster": {"worker": ["localhost:2222"], "ps": ["127.0.0.1:2222"]}})


@pytest.mark.parametrize("jobs", [
    {"worker": ["localhost:2222", "127.0.0.1:2223"]},  # one host, two ports
    {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]},  # two hosts, one port
    {"worker": ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"]},  # names that do not resolve here
])
def test_distinct_tasks_are_accepted(jobs: dict[str, list[str]]) -> None:
    assert ClusterSpec(jobs).as_dict() == jobs


def test_a_name_and_the_address_it_resolves_to_are_one_host() -> None:
    import socket

    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        pytest.skip(f"this machine's name {name!r} does not resolve")
    expected = (f"Two tasks share one address: worker:0 at '{name}:2222' and worker:1 at '{address}:2222' are the same "
                "host")
    with pytest.raises(TFConfigError, match=f"^{re.escape(expected)}"):
        ClusterSpec({"worker": [f"{name}:2222", f"{address}:2222"]})
