"""The local launcher with tiny scripts (no TensorFlow): TF_CONFIG per task, prefixed output,
exit status, restarts with backoff, hang detection, signal forwarding, reaping, errors."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tensorfleet import testing
from tensorfleet.cluster.launcher import (
    LaunchFailedError,
    PortInUseError,
    Recovery,
    TaskCommand,
    TaskOutput,
    TFConfigConflictError,
    Timeouts,
    launch,
)
from tensorfleet.strategies.tf_config import TFConfigError
from tensorfleet.testing import Fault

# Decides what to do from the task and attempt the launcher gives it:
#   argv: <exit code for worker:1 on attempt 0> [hang]
TASK_SCRIPT = """
import json, os, sys, time
task, attempt = os.environ["TENSORFLEET_TASK"], int(os.environ["TENSORFLEET_ATTEMPT"])
print("tf_config=" + os.environ["TF_CONFIG"])
print(f"{task} attempt {attempt}")
code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if "hang" in sys.argv[2:] and attempt == 0:
    time.sleep(600)
if task == "worker:1" and attempt == 0 and code:
    print("boom at attempt 0")
    sys.exit(code)
"""


@pytest.fixture
def task_script(tmp_path: Path) -> Path:
    path = tmp_path / "task.py"
    path.write_text(TASK_SCRIPT)
    return path


def _quiet(**kw):
    return dict(output=TaskOutput(log=None, **kw))


@pytest.mark.slow
def test_each_task_gets_its_own_tf_config_on_localhost(task_script: Path) -> None:
    # The evaluator may still be starting when the trainers are done: the launcher waits for it.
    result = launch(task_script, workers=2, chief=True, evaluator=True, **_quiet())
    assert result.returncode == 0 and result.restarts == 0
    spec = result.cluster
    assert spec.num_tasks() == 4
    for task in spec.tasks():
        lines = result.output(str(task))
        config = json.loads(lines[0].split("=", 1)[1])
        assert config == spec.tf_config(task.role, task.index)
        assert lines[1] == f"{task} attempt 0"
    hosts = {t.host for t in spec.tasks()}
    assert hosts == {"127.0.0.1"}
    assert len({t.port for t in spec.tasks()}) == 4


@pytest.mark.slow
def test_output_lines_are_prefixed_with_the_task(task_script: Path) -> None:
    seen: list[str] = []
    launch(task_script, workers=2, output=TaskOutput(log=seen.append))
    assert "[worker:0] worker:0 attempt 0" in seen
    assert "[worker:1] worker:1 attempt 0" in seen


@pytest.mark.slow
def test_exit_status_is_the_first_failures(task_script: Path) -> None:
    result = launch(task_script, ["7"], workers=2, chief=True, check=False, **_quiet())
    assert result.returncode == 7
    assert "worker:1 exited with status 7" in result.error


@pytest.mark.slow
def test_restart_limit_reached_names_the_failure_and_shows_its_log_tail(task_script: Path) -> None:
    with pytest.raises(LaunchFailedError) as info:
        launch(task_script, ["3"], workers=2, recovery=Recovery(max_restarts=0), **_quiet())
    message = str(info.value)
    assert "worker:1 exited with status 3" in message
    assert "restart limit reached (0 of max_restarts=0)" in message
    assert "[worker:1] boom at attempt 0" in message
    assert info.value.result.returncode == 3


@pytest.mark.slow
def test_failed_job_restarts_all_tasks_after_backoff_and_completes(task_script: Path) -> None:
    result = launch(task_script, ["3"], workers=2, recovery=Recovery(max_restarts=2, backoff=0.6), **_quiet())
    assert result.returncode == 0
    assert result.restarts == 1
    assert result.output("worker:0", attempt=1) [1:] == ["worker:0 attempt 1"]
    assert result.output("worker:1", attempt=1)[1:] == ["worker:1 attempt 1"]
    restart = [e for e in result.events if "restarting all 2 tasks (restart 1/2) in 0.6s" in e.text]
    assert len(restart) == 1
    # The second attempt starts no earlier than the backoff after the failure.
    second = result.first_time(r"attempt 1$")
    assert second is not None and second - restart[0].time >= 0.6


@pytest.mark.slow
def test_hang_timeout_ends_a_silent_attempt_in_a_restart(task_script: Path) -> None:
    result = launch(task_script, ["0", "hang"], workers=2, recovery=Recovery(max_restarts=1, backoff=0.1),
                    timeouts=Timeouts(hang_timeout=3.0), **_quiet())
    assert result.returncode == 0 and result.restarts == 1
    assert any("no task printed anything for hang_timeout=3s (hung)" in e.text for e in result.events)


@pytest.mark.slow
def test_attempt_timeout_without_restarts_fails_with_status_124(task_script: Path) -> None:
    with pytest.raises(LaunchFailedError, match=r"attempt 0 ran longer than timeout=1s") as info:
        launch(task_script, ["0", "hang"], workers=1, timeouts=Timeouts(timeout=1.0), **_quiet())
    assert info.value.result.returncode == 124


@pytest.mark.slow
def test_injected_fault_kills_the_task_and_the_job_restarts(tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(3)\nprint('finished')\n")
    with testing.faults(Fault("worker:1", r"^ready$", signal.SIGKILL)):
        result = launch(script, workers=2, **_quiet(), recovery=Recovery(max_restarts=1, backoff=0.1))
    assert result.returncode == 0 and result.restarts == 1
    assert any("worker:1 was killed by SIGKILL" in e.text for e in result.events)
    assert result.output("worker:1", attempt=0) == ["ready"]
    assert result.output("worker:1", attempt=1) == ["ready", "finished"]
    assert [(s.task, s.attempt, s.status) for s in result.spans] == [
        ("worker:0", 0, -9), ("worker:1", 0, -9), ("worker:0", 1, 0), ("worker:1", 1, 0)]
    assert all(s.start <= s.end for s in result.spans)
    png = result.plot(tmp_path / "timeline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_stop_when_stops_the_job_on_purpose(tmp_path: Path) -> None:
    script = tmp_path / "count.py"
    script.write_text("import time\nfor i in range(100):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.05)\n")
    result = launch(script, workers=1, **_quiet(stop_when=r"^tick 3$"))
    assert result.stopped and result.returncode == 0
    assert "tick 3" in result.output("worker:0")
    assert "tick 99" not in result.output("worker:0")


# ---------------------------------------------------------------- signals and reaping

FAMILY_SCRIPT = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(os.path.join(sys.argv[1], os.environ["TENSORFLEET_TASK"].replace(":", "_")), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
def on_term(signum, frame):
    print("got " + signal.Signals(signum).name, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(300)
"""


def _start_launcher(tmp_path: Path, extra: str = "") -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "family.py"
    script.write_text(FAMILY_SCRIPT)
    pids = tmp_path / "pids"
    pids.mkdir()
    code = textwrap.dedent(f"""
        from tensorfleet.cluster.launcher import Timeouts, launch
        launch({str(script)!r}, [{str(pids)!r}], workers=2, timeouts=Timeouts(grace=5.0), check=False{extra})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 30
    while len(list(pids.iterdir())) < 2 or any(not p.read_text() for p in pids.iterdir()):
        assert time.monotonic() < deadline, "tasks did not start"
        time.sleep(0.1)
    time.sleep(0.5)  # let the tasks install their handlers
    return proc, pids


def _family(pids: Path) -> list[int]:
    return [int(pid) for p in pids.iterdir() for pid in p.read_text().split()]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sigterm_reaches_every_task_and_no_descendant_outlives_the_launcher(tmp_path: Path) -> None:
    proc, pids = _start_launcher(tmp_path)
    family = _family(pids)
    assert len(family) == 4 and all(_alive(pid) for pid in family)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "[worker:0] got SIGTERM" in out and "[worker:1] got SIGTERM" in out
    assert "[launcher] received SIGTERM; stopping all tasks" in out
    # The tasks' own children (grandchildren of the launcher) are gone too.
    assert [pid for pid in family if _alive(pid)] == []


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_ctrl_c_is_forwarded_and_the_launcher_exits_130(tmp_path: Path) -> None:
    proc, pids = _start_launcher(tmp_path)
    family = _family(pids)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert "[launcher] received SIGINT; stopping all tasks" in out
    assert "KeyboardInterrupt" in out  # each task got the SIGINT
    assert [pid for pid in family if _alive(pid)] == []


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_tasks_die_with_a_launcher_that_is_killed(tmp_path: Path) -> None:
    proc, pids = _start_launcher(tmp_path)
    tasks = [int(p.read_text().split()[0]) for p in pids.iterdir()]
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in tasks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in tasks if _alive(pid)] == []
    for p in pids.iterdir():  # the tasks' own children are orphans now; clean up after the test
        grandchild = int(p.read_text().split()[1])
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


# ---------------------------------------------------------------- errors


def test_missing_script_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"The script to launch does not exist\. Received: script='.*nope\.py'"):
        launch(tmp_path / "nope.py", workers=2)


def test_zero_workers_is_a_clear_error(task_script: Path) -> None:
    with pytest.raises(ValueError, match=r"A job needs at least one worker \(or a chief\)\. Received: workers=0"):
        launch(task_script, workers=0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"workers": -1}, "workers must be an integer >= 0. Received: workers=-1"),
    ({"mode": "ring"}, "mode must be one of 'auto', 'collective', 'parameter_server'. Received: mode='ring'"),
    ({"mode": "parameter_server"}, "mode='parameter_server' needs at least one ps task. Received: ps=0"),
])
def test_bad_options_are_clear_errors(task_script: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        launch(task_script, **kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Recovery(max_restarts=-2), "max_restarts must be an integer >= 0. Received: max_restarts=-2"),
    (lambda: Timeouts(timeout=-1.0), "timeout must be a finite number > 0. Received: timeout=-1.0"),
    (lambda: Timeouts(hang_timeout=0), "hang_timeout must be a finite number > 0. Received: hang_timeout=0"),
    (lambda: Timeouts(grace=float("nan")), "grace must be a finite number >= 0. Received: grace=nan"),
    (lambda: TaskOutput(stop_when="(tick"),
     "stop_when must be a regular expression (missing ), unterminated subpattern at position 0). "
     "Received: stop_when='(tick'"),
    (lambda: TaskOutput(progress_interval=-1), "progress_interval must be a finite number >= 0. "
                                               "Received: progress_interval=-1"),
    (lambda: TaskCommand(runner="-m x"), "runner must be a sequence of strings, such as ('-m', "
                                         "'tensorfleet.profiling.autorun'). Received: runner='-m x'"),
    (lambda: TaskCommand(env={"A": 1}), "env must map names to strings. Received: env={'A': 1}"),
])
def test_each_option_group_refuses_a_bad_value_when_made(make, message: str) -> None:
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value) == message


def test_a_backup_dir_that_cannot_be_written_is_refused_when_made() -> None:
    with pytest.raises(ValueError) as info:
        Recovery(backup_dir="/proc/nope")
    # The reason after the colon is the OS's (it differs between users): the start names the path and the probe.
    assert str(info.value).startswith("backup_dir cannot hold the run's files: Cannot write '/proc/nope/backup': ")
    assert str(info.value).endswith("Received: backup_dir='/proc/nope'")


def test_a_backup_dir_that_is_a_file_is_refused_before_any_task_starts(task_script: Path) -> None:
    with pytest.raises(ValueError) as info:
        launch(task_script, recovery=Recovery(backup_dir=task_script))
    assert str(info.value) == (f"backup_dir must be a directory; {str(task_script)!r} is a file. "
                               f"Received: backup_dir={str(task_script)!r}")


def test_a_group_of_the_wrong_type_is_named(task_script: Path) -> None:
    with pytest.raises(TypeError) as info:
        launch(task_script, recovery={"max_restarts": 2})
    assert str(info.value) == ("recovery must be a Recovery, such as recovery=Recovery(). "
                               "Received: recovery={'max_restarts': 2}")
    with pytest.raises(TypeError, match=r"^log must be a function of one line \(str\), or None\. Received: log=3$"):
        TaskOutput(log=3)


def test_port_in_use_is_a_clear_error(task_script: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortInUseError) as info:
            launch(task_script, workers=2, ports=[port + 1 if port < 65000 else port - 1, port])
    assert str(info.value) == (f"Port {port} of worker:1 is already in use on 127.0.0.1. "
                               "Choose other ports, or leave ports unset to pick free ones.")
    assert isinstance(info.value, ValueError)


def test_conflicting_tf_config_in_the_environment_is_a_clear_error(task_script: Path, monkeypatch) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["10.0.0.1:2222"]},
                                                "task": {"type": "worker", "index": 0}}))
    with pytest.raises(TFConfigConflictError, match=r"TF_CONFIG is already set in the environment with another "
                                                    r"cluster \(\{\"worker\": \[\"10\.0\.0\.1:2222\"\]\}\)"):
        launch(task_script, workers=2)
    assert issubclass(TFConfigConflictError, TFConfigError)


@pytest.mark.slow
def test_tf_config_naming_the_same_cluster_is_accepted(task_script: Path, monkeypatch) -> None:
    import portpicker

    ports = [portpicker.pick_unused_port() for _ in range(2)]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    result = launch(task_script, workers=2, ports=ports, **_quiet())
    assert json.loads(result.output("worker:1")[0].split("=", 1)[1])["task"] == {"type": "worker", "index": 1}


def test_env_must_not_set_tf_config(task_script: Path) -> None:
    with pytest.raises(TFConfigConflictError, match=r"env must not set TF_CONFIG"):
        launch(task_script, command=TaskCommand(env={"TF_CONFIG": "{}"}))


@pytest.mark.slow
def test_the_launcher_itself_listens_on_no_port(task_script: Path) -> None:
    me = psutil.Process()

    def listening() -> set[tuple[str, int]]:
        return {(c.laddr.ip, c.laddr.port) for c in me.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}

    before = listening()
    during: list[set[tuple[str, int]]] = []
    launch(task_script, workers=2, output=TaskOutput(log=lambda line: during.append(listening())))
    assert during and all(sockets == before for sockets in during)


BIND_SCRIPT = """
import os, socket
for family, wildcard in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((wildcard, 0))
    s.listen()
    mine = s.getsockname()[1]
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == mine:
                print(f"{family.name} {local.rsplit(':', 1)[0]}")
    s.close()
"""


@pytest.mark.slow
def test_tasks_bind_wildcard_listeners_to_loopback_only(tmp_path: Path) -> None:
    # TensorFlow's gRPC server binds [::]:port; in a launched task such a bind lands on 127.0.0.1.
    script = tmp_path / "bind.py"
    script.write_text(BIND_SCRIPT)
    result = launch(script, workers=1, **_quiet())
    assert result.returncode == 0
    assert result.output("worker:0") == [
        "AF_INET6 0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1, not [::]
        "AF_INET 0100007F",  # 127.0.0.1, not 0.0.0.0
    ]
