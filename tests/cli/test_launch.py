"""`tensorfleet launch` through the CLI: prefixed output, script arguments, exit status,
restarts and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorfleet.cli.main import main

SCRIPT = """
import os, sys
task, attempt = os.environ["TENSORFLEET_TASK"], int(os.environ["TENSORFLEET_ATTEMPT"])
print(f"{task} args={sys.argv[1:]}")
if "--fail-once" in sys.argv and attempt == 0 and task == "worker:1":
    sys.exit(5)
if "--fail" in sys.argv and task == "worker:1":
    print("giving up")
    sys.exit(4)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def test_launch_runs_every_task_with_the_scripts_arguments(script: Path, capsys) -> None:
    assert main(["launch", "--workers", "2", "--chief", str(script), "--", "--epochs", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    for task in ("chief:0", "worker:0", "worker:1"):
        assert f"[{task}] {task} args=['--epochs', '3']" in out


def test_launch_exits_with_the_failures_status_and_shows_its_log_tail(script: Path, capsys) -> None:
    assert main(["launch", "--workers", "2", str(script), "--fail"]) == 4
    captured = capsys.readouterr()
    assert "[launcher] worker:1 exited with status 4; restart limit reached (0 of max_restarts=0)" in captured.out
    assert captured.err.startswith("error: The job failed: worker:1 exited with status 4; restart limit reached")
    assert "  [worker:1] giving up" in captured.err


def test_launch_restarts_the_job_up_to_max_restarts(script: Path, capsys) -> None:
    assert main(["launch", "--workers", "2", "--max-restarts", "1", "--backoff", "0.1", str(script),
                 "--fail-once"]) == 0
    out = capsys.readouterr().out
    assert "[launcher] worker:1 exited with status 5; restarting all 2 tasks (restart 1/1) in 0.1s" in out
    assert "[launcher] restarted the job (attempt 1)" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["launch", "--workers", "0", "SCRIPT"], "error: A job needs at least one worker (or a chief). Received: workers=0"),
    (["launch", "MISSING"], "error: The script to launch does not exist. Received: script="),
    (["launch", "--ports", "1,x", "SCRIPT"], "error: --ports must be comma-separated integers. Received: --ports='1,x'"),
    (["launch", "--evaluator", "--evaluator-timeout", "-1", "SCRIPT"],
     "error: evaluator_timeout must be a finite number >= 0. Received: evaluator_timeout=-1.0"),
])
def test_launch_bad_input_is_one_clear_error(script: Path, tmp_path: Path, capsys, argv, message) -> None:
    argv = [str(script) if a == "SCRIPT" else str(tmp_path / "missing.py") if a == "MISSING" else a for a in argv]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(message)


def test_launch_conflicting_tf_config_is_one_clear_error(script: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["10.1.1.1:2222"]}, "task": {"type": "worker", "index": 0}}')
    assert main(["launch", str(script)]) == 2
    assert capsys.readouterr().err.startswith("error: TF_CONFIG is already set in the environment with another cluster")


@pytest.mark.parametrize(("option", "message"), [
    ("--wokers", "Error: No such option: --wokers. Did you mean --workers?"),
    ("--max-restart=2", "Error: No such option: --max-restart=2. Did you mean --max-restarts?"),
    ("--frobnicate", "Error: No such option: --frobnicate"),
    ("--mode", "Error: Invalid value for '--mode': Value error, '2' is not one of 'auto', 'collective', "
               "'parameter_server'."),
])
def test_launch_unknown_option_before_the_script_is_reported_as_an_option(script: Path, capsys, option,
                                                                          message) -> None:
    assert main(["launch", option, "2", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1] == message
    assert "does not exist" not in err
