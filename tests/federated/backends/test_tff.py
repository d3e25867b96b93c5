"""No TFF worker_binary outlives the process that started it (real processes, checked in /proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import reap

pytestmark = pytest.mark.tff  # TFF's worker_binary

ROOT = Path(__file__).resolve().parents[2]

# Starts the simulation's worker, prints "<worker pid> <port>", then runs rounds.
SCRIPT = textwrap.dedent("""
    import sys
    import tensorfleet as tfl
    split = tfl.models.datasets.load_digits(flat=True)
    clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=10, scheme="iid")
    sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_mlp", hidden=8), clients,
                                   rounds=int(sys.argv[1]), clients_per_round=5, progress=False, backend="tff")
    sim.build().initialize()
    print(sim.runtime.worker.pid, sim.runtime.worker.port, flush=True)
    sim.run()
    print("done", flush=True)
""")


def _alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _worker_binaries() -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "worker_binary" and _alive(int(entry.name)):
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


def _start(rounds: int) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(rounds)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_worker_stops_when_the_simulation_ends_and_the_pipe_closes():
    before = _worker_binaries()
    proc = _start(rounds=2)
    try:
        out, _ = proc.communicate(timeout=200)  # returns only when every holder of the pipe has closed it
    finally:
        reap(proc)
    pid, port = (int(v) for v in out.splitlines()[0].split())
    assert out.splitlines()[-1] == "done" and proc.returncode == 0
    assert pid not in before
    assert _wait_gone(pid, 5.0), f"worker_binary {pid} (port {port}) outlived its parent"
    assert pid not in _worker_binaries()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_worker_dies_with_a_sigkilled_parent():
    proc = _start(rounds=10_000)
    try:
        line = proc.stdout.readline()
        pid, port = (int(v) for v in line.split())
        assert _alive(pid)
        time.sleep(1.0)  # let it run rounds
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        reap(proc)
        proc.stdout.close()
    assert _wait_gone(pid, 10.0), f"worker_binary {pid} (port {port}) outlived its SIGKILLed parent"


def test_local_worker_start_stop_in_process():
    from tensorfleet.federated.backends.tff import LocalWorker, live_workers

    worker = LocalWorker().start()
    pid = worker.pid
    try:
        assert _alive(pid) and worker in live_workers()
        assert Path(f"/proc/{worker.pid}/fd/1").resolve() == Path("/dev/null")  # not our stdout
    finally:
        worker.stop()
    assert not worker.running and worker not in live_workers()
    assert _wait_gone(pid, 1.0)


def test_bad_worker_arguments_are_refused():
    from tensorfleet.federated.backends.tff import LocalWorker

    with pytest.raises(ValueError, match=r"port must be an integer from 1 to 65535. Received: port=70000"):
        LocalWorker(port=70000)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_run_piped_into_tail_ends_when_the_run_ends():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    command = (f"{sys.executable} -m tensorfleet.cli.main federated run --backend tff --clients 10 "
               f"--clients-per-round 5 --rounds 2 --no-progress 2>/dev/null | tail -1")  # tff: the one with a worker
    start = time.monotonic()
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=ROOT, timeout=200)
    assert proc.returncode == 0
    last = proc.stdout.strip()
    assert last.startswith('{"algorithm": "fedavg", "backend": "tff", "rounds": 2'), last
    assert time.monotonic() - start < 200
