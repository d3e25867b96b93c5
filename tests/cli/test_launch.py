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


@pytest.mark.slow
def test_launch_runs_every_task_with_the_scripts_arguments(script: Path, capsys) -> None:
    assert main(["launch", "--workers", "2", "--chief", str(script), "--", "--epochs", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    for task in ("chief:0", "worker:0", "worker:1"):
        assert f"[{task}] {task} args=['--epochs', '3']" in out


@pytest.mark.slow
def test_launch_exits_with_the_failures_status_and_shows_its_log_tail(script: Path, capsys) -> None:
    assert main(["launch", "--workers", "2", str(script), "--fail"]) == 4
    captured = capsys.readouterr()
    assert "[launcher] worker:1 exited with status 4; restart limit reached (0 of max_restarts=0)" in captured.out
    assert captured.err.startswith("error: The job failed: worker:1 exited with status 4; restart limit reached")
    assert "  [worker:1] giving up" in captured.err


@pytest.mark.slow
def test_launch_restarts_the_job_up_to_max_restarts(script: Path, capsys) -> None:
    assert main(["launch", "--workers", "2", "--max-restarts", "1", "--backoff", "0.1", str(script),
                 "--fail-once"]) == 0
    out = capsys.readouterr().out
    assert "[launcher] worker:1 exited with status 5; restarting all 2 tasks (restart 1/1) in 0.1s" in out
    assert "[launcher] restarted the job (attempt 1)" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["launch", "--workers", "0", "SCRIPT"],
     "error: A job needs at least one worker (or a chief). Received: workers=0"),
    (["launch", "MISSING"], "error: The script to launch does not exist. Received: script="),
    (["launch", "--ports", "1,x", "SCRIPT"],
     "error: --ports must be comma-separated integers. Received: --ports='1,x'"),
    (["launch", "--evaluator", "--evaluator-timeout", "-1", "SCRIPT"],
     "error: evaluator_timeout must be a finite number >= 0. Received: evaluator_timeout=-1.0"),
])
def test_launch_bad_input_is_one_clear_error(script: Path, tmp_path: Path, capsys, argv, message) -> None:
    argv = [str(script) if a == "SCRIPT" else str(tmp_path / "missing.py") if a == "MISSING" else a for a in argv]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(message)


def test_launch_conflicting_tf_config_is_one_clear_error(script: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TF_CONFIG",
                       '{"cluster": {"worker": ["10.1.1.1:2222"]}, "task": {"type": "worker", "index": 0}}')
    assert main(["launch", str(script)]) == 2
    assert capsys.readouterr().err.startswith("error: TF_CONFIG is already set in the environment with another cluster")


@pytest.mark.parametrize(("option", "message"), [
    ("--wokers", "error: No such option: --wokers. Did you mean --workers?"),
    ("--max-restart=2", "error: No such option: --max-restart=2. Did you mean --max-restarts?"),
    ("--frobnicate", "error: No such option: --frobnicate"),
    ("--mode", "error: Invalid value for '--mode': '2' is not one of 'auto', 'collective', 'parameter_server'. "
               "Received: --mode '2'"),
])
def test_launch_unknown_option_before_the_script_is_reported_as_an_option(script: Path, capsys, option,
                                                                          message) -> None:
    assert main(["launch", option, "2", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1] == message
    assert "does not exist" not in err


# ---------------------------------------------------------------- launch --share

MIGRATING_JOB = Path(__file__).parents[1] / "cluster" / "migrating_job.py"


#: Appended to a migratable job: in a task, it shows the job's arguments and fails its first attempt on
#: "--fail-once" (the launcher's own process reads the file too, to fingerprint the model: it does neither).
JOB_HEADER = """
import os, sys
if "TENSORFLEET_TASK" in os.environ:
    print(f"job args={sys.argv[1:]}", flush=True)
    if "--fail-once" in sys.argv and os.environ["TENSORFLEET_ATTEMPT"] == "0":
        sys.exit(3)
"""


@pytest.fixture
def two_jobs(tmp_path: Path) -> tuple[Path, Path]:
    """Two migratable jobs: the same small MLP on the first and the second 96 training digits (6 steps of 16)."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(MIGRATING_JOB.read_text() + JOB_HEADER)
    b.write_text(MIGRATING_JOB.read_text().replace("[:EXAMPLES]", "[EXAMPLES:2 * EXAMPLES]") + JOB_HEADER)
    return a, b


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_share_runs_two_jobs_time_sliced_and_writes_the_timeline(two_jobs, tmp_path: Path, capsys) -> None:
    import re

    from tensorfleet.cluster.jobstate import read_state

    a, b = two_jobs
    ckpt = tmp_path / "ckpt"
    assert main(["launch", "--checkpoint-dir", str(ckpt), "--epochs", "1", "--global-batch-size", "16", "--timeout",
                 "170", "--quantum", "4", "--share", "0.75", str(a), "--", "--tag", "a", "--share=0.25", str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sorted(line for line in out if "job args" in line) == [  # the two jobs' processes print in any order
        "[a] [worker:0] job args=['--tag', 'a']", "[b] [worker:0] job args=[]"]
    assert "[a] [worker:0] tensorfleet: finished at step 6" in "\n".join(out)
    assert "[b] [worker:0] tensorfleet: saved step 6" in out
    summary = [re.fullmatch(r"(\w): (\d+) steps, ([0-9.]+) of the steps while all jobs ran \(share ([0-9.]+)\), "
                            r"exit status 0", line) for line in out[-3:-1]]
    assert [(m.group(1), m.group(2), m.group(4)) for m in summary] == [("a", "6", "0.75"), ("b", "6", "0.25")]
    got = [float(m.group(3)) for m in summary]
    assert got[0] > got[1] and abs(sum(got) - 1) <= 0.011  # a ran 3 steps a round to b's 1 while both ran
    assert re.fullmatch(rf"makespan [0-9.]+ s; timeline: {re.escape(str(ckpt / 'timeline.png'))}", out[-1])
    assert (ckpt / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert [read_state(ckpt / name)[0].step for name in ("a", "b")] == [6, 6]


@pytest.mark.parametrize(("argv", "message"), [
    (["--share", "0.5", "A", "--share", "0.6", "B"],
     "error: The jobs' shares must each be between 0 and 1 and sum to 1. Received: shares=[0.5, 0.6] (sum 1.1)"),
    (["--share", "1.5", "A", "--share", "-0.5", "B"],
     "error: The jobs' shares must each be between 0 and 1 and sum to 1. Received: shares=[1.5, -0.5] (sum 1)"),
    (["--share", "0.5", "A", "--share", "0.5", "MISSING"],
     "error: The script of a shared job does not exist. Received: 'MISSING'"),
    (["--share", "0.5", "A", "--share", "half", "B"],
     "error: --share takes a fraction of the devices between 0 and 1, then the job's script (--share 0.25 b.py). "
     "Received: --share 'half'"),
    (["--share", "half", "A", "--share", "0.5", "B"],
     "error: Invalid value for '--share': Input should be a valid number, unable to parse string as a number. "
     "Received: --share 'half'"),
    (["--share", "0.5", "A", "--share", "0.5"], "error: Each shared job is '--share FRACTION SCRIPT'. Received: 2 "
                                                "share(s) [0.5, 0.5] and 1 script(s) ['A']"),
    (["--share", "0.5", "A", "--epochs", "2", "--share", "0.5", "B"],
     "error: With --share, the options of launch come before the first --share; after it only "
     "'--share FRACTION SCRIPT' pairs follow, each script's own arguments after '--' (--share 0.25 b.py -- --lr 0.1). "
     "Received: '--epochs'"),
])
def test_share_bad_input_is_one_clear_error_before_anything_starts(two_jobs, tmp_path: Path, capsys, argv,
                                                                   message) -> None:
    names = {"A": str(two_jobs[0]), "B": str(two_jobs[1]), "MISSING": str(tmp_path / "missing.py")}
    ckpt = tmp_path / "ckpt"
    assert main(["launch", "--checkpoint-dir", str(ckpt), *[names.get(a, a) for a in argv]]) == 2
    err = capsys.readouterr().err.strip()
    for name, path in names.items():
        message = message.replace(f"'{name}'", repr(path))
    assert err.splitlines()[-1] == message
    assert not ckpt.exists()


def test_share_needs_a_checkpoint_dir_and_launch_needs_a_script(two_jobs, capsys) -> None:
    a, b = map(str, two_jobs)
    assert main(["launch", "--share", "0.5", a, "--share", "0.5", b]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: Shared jobs keep their checkpoints in a directory each: give --checkpoint-dir DIR (a job's is "
        "DIR/<its script's name>; an existing one is continued).")
    assert main(["launch", "--workers", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: Missing argument 'SCRIPT'."


def test_share_summary_of_a_job_that_failed_before_its_first_step_names_it_and_exits_with_its_status(capsys) -> None:
    import typer

    from tensorfleet.cli.launch import _finish_shared
    from tensorfleet.cluster.multiplex import ShareResult
    from tensorfleet.cluster.result import LaunchResult
    from tensorfleet.strategies.tf_config import ClusterSpec

    cluster = ClusterSpec.local(workers=1)
    result = ShareResult(results=[LaunchResult(0, 0, cluster), LaunchResult(3, 0, cluster, error="worker:0 exited 3")],
                         steps=[[1.0, 2.0], []], requested=[0.5, 0.5], makespan=4.0)
    with pytest.raises(typer.Exit) as info:
        _finish_shared((result, ["a", "b"], None))
    assert info.value.exit_code == 3
    out, err = capsys.readouterr()
    assert out.splitlines() == ["a: 2 steps, no shares measured (share 0.5), exit status 0",
                                "b: 0 steps, no shares measured (share 0.5), exit status 3", "makespan 4.0 s"]
    assert err.strip() == "error: b: worker:0 exited 3"


# ---------------------------------------------------------------- the modes and the options each takes

def _launch_flags() -> dict[str, str]:
    import typer

    from tensorfleet.cli.main import app

    command = typer.main.get_command(app).commands["launch"]
    return {p.name: next((o for o in p.opts if o.startswith("--")), p.name) for p in command.params}


def test_every_launch_option_is_declared_with_its_modes_and_the_reference_shows_the_table() -> None:
    from tensorfleet.cli.launch import MODES, mode_table

    flags = _launch_flags()
    assert set(MODES) == set(flags) - {"script", "args"}
    page = (Path(__file__).parents[2] / "docs" / "ref-cli.md").read_text()
    assert mode_table(flags) in page


#: A value for each option, as given on the command line.
GIVEN = {"workers": ["--workers", "1"], "ps": ["--ps", "1"], "chief": ["--chief"], "evaluator": ["--evaluator"],
         "evaluator_timeout": ["--evaluator-timeout", "5"], "max_restarts": ["--max-restarts", "2"],
         "timeout": ["--timeout", "60"], "hang_timeout": ["--hang-timeout", "30"], "backoff": ["--backoff", "0"],
         "ports": ["--ports", "5000"], "backup_dir": ["--backup-dir", "bk"], "mode_option": ["--mode", "collective"],
         "profile_steps": ["--profile-steps", "2-3"], "profile_dir": ["--profile-dir", "pd"],
         "strategy": ["--strategy", "mirrored"], "devices": ["--devices", "2"],
         "checkpoint_dir": ["--checkpoint-dir", "CK"],
         "resume_from": ["--resume-from", "CK"], "epochs": ["--epochs", "2"],
         "global_batch_size": ["--global-batch-size", "8"],
         "batch_policy": ["--batch-policy", "keep_global"], "stop_at_step": ["--stop-at-step", "3"],
         "save_every": ["--save-every", "1"], "quantum": ["--quantum", "4"], "timeline": ["--timeline", "t.png"]}
#: What chooses each mode (before the option tried), and what follows the options.
CHOOSE = {"plain": ([], ["A"]), "migrate": (["--checkpoint-dir", "CK"], ["A"]),
          "share": (["--checkpoint-dir", "CK"], ["--share", "0.5", "A", "--share", "0.5", "B"])}


def _refusals() -> list[tuple[str, str]]:
    from tensorfleet.cli.launch import MODES, mode_of

    return [(name, mode) for name, modes in MODES.items() for mode in CHOOSE if mode not in modes and name in GIVEN
            and mode_of({name} | ({"checkpoint_dir"} if mode == "migrate" else {"share"} if mode == "share" else set()))
            == mode]


@pytest.mark.parametrize(("name", "mode"), _refusals())
def test_an_option_the_mode_does_not_take_is_refused_naming_both(two_jobs, tmp_path: Path, capsys, name,
                                                                  mode) -> None:
    from tensorfleet.cli.launch import MODE_NAMES

    names = {"A": str(two_jobs[0]), "B": str(two_jobs[1]), "CK": str(tmp_path / "ckpt")}
    before, after = CHOOSE[mode]
    argv = ["launch", *before, *GIVEN[name], *after]
    assert main([names.get(a, a) for a in argv]) == 2
    flag = GIVEN[name][0]
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flag} does not apply to {MODE_NAMES[mode]}")
    assert err.endswith(f"Received: {' '.join(names.get(a, a) for a in GIVEN[name])}")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "ckpt").exists()


def test_the_refusal_says_why_and_where_the_option_applies(two_jobs, tmp_path: Path, capsys) -> None:
    assert main(["launch", "--resume-from", str(tmp_path), "--backup-dir", "bk", str(two_jobs[0])]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --backup-dir does not apply to a migratable job (--strategy, --checkpoint-dir or --resume-from): a "
        "migratable job's backups are its checkpoints in --checkpoint-dir. It applies to a script (plain launch). "
        "Received: --backup-dir bk")
    assert main(["launch", "--epochs", "3", str(two_jobs[0])]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --epochs does not apply to a script (plain launch). It applies to a migratable job (--strategy, "
        "--checkpoint-dir or --resume-from) and shared devices (--share). Received: --epochs 3")
    assert main(["launch", "--profile-dir", "pd", str(two_jobs[0])]) == 2
    assert capsys.readouterr().err.strip() == "error: --profile-dir applies with --profile-steps. Received: " \
                                              "--profile-dir pd without --profile-steps"


def test_shared_jobs_take_their_own_arguments_after_a_double_dash(two_jobs) -> None:
    from tensorfleet.cli.launch import _shared_jobs

    a, b = two_jobs
    assert _shared_jobs([0.25], a, ["--", "--lr", "0.1", "x", "--share", "0.75", str(b), "--", "--"]) == [
        (0.25, a, ["--lr", "0.1", "x"]), (0.75, b, ["--"])]
    assert _shared_jobs([0.5], a, ["--share=0.5", str(b)]) == [(0.5, a, []), (0.5, b, [])]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_migratable_job_takes_restarts_time_outs_ports_and_its_arguments(two_jobs, tmp_path: Path, capsys) -> None:
    """``launch --resume-from ckpt --max-restarts 2 job.py``: the restart applies and continues the checkpoint."""
    import portpicker

    from tensorfleet.cluster.jobstate import read_state

    job, ckpt = str(two_jobs[0]), str(tmp_path / "ckpt")
    port = portpicker.pick_unused_port()
    assert main(["launch", "--strategy", "mirrored", "--checkpoint-dir", ckpt, "--global-batch-size", "16",
                 "--stop-at-step", "2", "--ports", str(port), job, "--tag", "first"]) == 0
    out = capsys.readouterr().out
    assert "[worker:0] job args=['--tag', 'first']" in out
    assert read_state(ckpt)[0].step == 2
    assert main(["launch", "--resume-from", ckpt, "--max-restarts", "2", "--backoff", "0", "--timeout", "240",
                 "--hang-timeout", "200", "--mode", "collective", job, "--", "--fail-once"]) == 0
    out = capsys.readouterr().out
    assert "[launcher] worker:0 exited with status 3; restarting all 1 tasks (restart 1/2) in 0s" in out
    assert out.count("[worker:0] job args=['--fail-once']") == 2
    assert "[worker:0] tensorfleet: resumed at step 2 (epoch 1, example 32 of 96) from mirrored over 1 replica(s); " \
           "optimizer step 2" in out
    assert read_state(ckpt)[0].step == 6
