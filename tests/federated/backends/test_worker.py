"""One TFF C++ worker on host:port: the API and ``tensorfleet federated worker``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import portpicker
import pytest

from tensorfleet.federated.backends.worker import Worker, WorkerPortInUseError, check_port_free
from tests.conftest import reap


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _serves(port: int, timeout: float = 10.0) -> bool:
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    future = grpc.channel_ready_future(channel)
    try:
        future.result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        future.cancel()
        return False
    finally:
        channel.close()


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids.extend(int(c) for c in f.read().split())
    return kids


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_worker_serves_on_its_port_and_stop_reaps_it() -> None:
    port = portpicker.pick_unused_port()
    worker = Worker(port).start()
    pid = worker.pid
    try:
        assert worker.address == f"127.0.0.1:{port}"
        assert worker.running
        assert _comm(pid) == "worker_binary"
        assert _serves(port)
        assert repr(worker) == f"Worker(127.0.0.1:{port}, pid={pid})"
    finally:
        worker.stop()
    assert not worker.running
    assert _gone(pid)
    assert repr(worker) == f"Worker(127.0.0.1:{port}, stopped)"


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_second_worker_on_a_busy_port_is_refused_naming_the_port() -> None:
    port = portpicker.pick_unused_port()
    with Worker(port) as first:
        first_pid = first.pid
        with pytest.raises(WorkerPortInUseError) as info:
            Worker(port).start()
        assert str(info.value) == (
            f"Port {port} is in use on 127.0.0.1: TFF's worker cannot serve there. Pick another port "
            f"(or port=None for a free one), or stop the process that holds it.")
        assert first.running  # the first worker is untouched
    assert _gone(first_pid)


def test_port_held_by_any_socket_counts_as_busy() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(WorkerPortInUseError, match=f"Port {port} is in use on 127.0.0.1"):
            check_port_free(port)
    finally:
        holder.close()
    check_port_free(port)  # free again: no error


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"port": 0}, "port must be an integer from 1 to 65535. Received: port=0"),
    ({"port": 70000}, "port must be an integer from 1 to 65535. Received: port=70000"),
    ({"port": "8471"}, "port must be an integer from 1 to 65535. Received: port='8471'"),
    ({"port": 8471, "host": "192.0.2.1"}, "host must be 127.0.0.1 (or localhost) or every interface (0.0.0.0, "
                                          "::): TFF's worker binds one of those. "
                                          "Received: host='192.0.2.1'"),
    ({"port": 8471, "max_concurrent": 1.5}, "max_concurrent must be an integer. "
                                            "Received: max_concurrent=1.5"),
])
def test_bad_worker_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        Worker(**kwargs)
    assert str(info.value) == message


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net shows them) of the sockets listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    found.append(local.rsplit(":", 1)[0])
    return found


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_worker_listens_on_loopback_only_unless_told_otherwise() -> None:
    from tensorfleet.federated.backends.worker import bind_shim_path

    assert bind_shim_path() is not None  # the machine has a C compiler
    port = portpicker.pick_unused_port()
    with Worker(port):
        # ::ffff:127.0.0.1 on the binary's dual-stack socket, not [::] (which would be all zeros).
        assert _listening(port) == ["0000000000000000FFFF00000100007F"]
        assert _serves(port)
    port = portpicker.pick_unused_port()
    with Worker(port, host="0.0.0.0") as everywhere:
        assert everywhere.address == f"0.0.0.0:{port}"
        assert _listening(port) == ["00000000000000000000000000000000"]


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_cli_worker_serves_until_sigterm_and_leaves_no_worker_behind() -> None:
    port = portpicker.pick_unused_port()
    cli = subprocess.Popen([sys.executable, "-m", "tensorfleet.cli.main", "federated", "worker", "--port", str(port)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = cli.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith(f"TFF worker serving on 127.0.0.1:{port} (pid "), line
        worker_pid = int(line.split("(pid ")[1].split(")")[0])
        assert worker_pid in _children(cli.pid)
        assert _comm(worker_pid) == "worker_binary"
        assert _serves(port)
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=30) == 0
    finally:
        reap(cli)
    deadline = time.monotonic() + 5
    while not _gone(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(worker_pid)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_cli_worker_on_a_busy_port_exits_2_naming_the_port(capsys: pytest.CaptureFixture[str]) -> None:
    from tensorfleet.cli.main import main

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        assert main(["federated", "worker", "--port", str(port)]) == 2
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert err.startswith(f"error: Port {port} is in use on 127.0.0.1: TFF's worker cannot serve there.")


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_run_with_workers_splits_rounds_across_them(capsys: pytest.CaptureFixture[str]) -> None:
    from tensorfleet.cli.main import main

    workers = [Worker(portpicker.pick_unused_port()).start() for _ in range(2)]
    pids = [w.pid for w in workers]
    try:
        code = main(["federated", "run", "--dataset", "digits", "--clients", "12", "--rounds", "2",
                     "--clients-per-round", "4", "--no-progress", "--workers", ",".join(w.address for w in workers)])
    finally:
        for w in workers:
            w.stop()
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    summary = json.loads(out[-1])
    assert summary["algorithm"] == "fedavg"
    assert summary["rounds"] == 2
    assert 0.0 <= summary["train_accuracy"] <= 1.0
    assert all(_gone(pid) for pid in pids)


def test_cli_run_refuses_a_bad_worker_address(capsys: pytest.CaptureFixture[str]) -> None:
    from tensorfleet.cli.main import main

    assert main(["federated", "run", "--rounds", "1", "--workers", "127.0.0.1:8471,nonsense"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: Worker addresses are HOST:PORT with a port in [1, 65535], e.g. '127.0.0.1:8471'. Received: 'nonsense'")
