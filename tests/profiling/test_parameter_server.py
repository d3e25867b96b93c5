"""``tensorfleet launch --profile-steps`` on a parameter-server job (a chief, 2 workers, 1 ps on 127.0.0.1):
every task is recorded into its own directory, and the report names each with its role."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "profiling" / "ps_job.py"
TIMEOUT = 240
CHOSEN = list(range(8, 16))  # steps 8-15 of the job's 24


@pytest.fixture(scope="module")
def ps_profile(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ps")
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    done = subprocess.run([sys.executable, "-m", "tensorfleet.cli.main", "launch", "--workers", "2", "--ps", "1",
                           "--profile-steps", "8-15", "--profile-dir", "prof", str(SCRIPT)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[chief:0] iterations=24" in done.stdout
    return root / "prof"


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_capture_in_a_custom_loop_records_the_workers_and_ps_through_the_coordinator(tmp_path):
    from tensorfleet.profiling.xspace import StepSource, task_traces

    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    done = subprocess.run([sys.executable, "-m", "tensorfleet.cli.main", "launch", "--workers", "2", "--ps", "1",
                           str(SCRIPT), "--loop", str(tmp_path / "prof")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[chief:0] iterations=24" in done.stdout
    traces = {t.task: t for t in task_traces(tmp_path / "prof")}
    assert sorted(traces) == ["chief-0", "ps-0", "worker-0", "worker-1"]
    assert [s.number for s in traces["chief-0"].steps] == list(range(6, 14))  # ps_job.LOOP_STEPS
    workers = [traces["worker-0"], traces["worker-1"]]
    assert {t.step_source for t in workers if t.steps} == {StepSource.FUNCTION}
    assert sum(len(t.steps) for t in workers) == 8 == traces["ps-0"].served


def _op_types(path: Path) -> set[str]:
    """The op types (``name:OpType`` events) in one trace file, read with the profiler's protos."""
    from tensorfleet.compat.profiler import xplane_pb2

    space = xplane_pb2().XSpace()
    space.ParseFromString(path.read_bytes())
    return {meta.display_name for plane in space.planes for meta in plane.event_metadata.values()
            if meta.display_name and meta.name.endswith(":" + meta.display_name)}


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_every_task_of_a_parameter_server_job_records_its_own_part_of_the_chosen_steps(ps_profile):
    from tensorfleet.profiling.xspace import StepSource, find_traces, task_traces

    files = find_traces(ps_profile)
    assert {task: len(paths) for task, paths in files.items()} == {"chief-0": 1, "ps-0": 1, "worker-0": 1,
                                                                   "worker-1": 1}
    traces = {t.task: t for t in task_traces(ps_profile)}
    # The coordinator schedules the chosen steps; the workers between them run exactly those steps
    # (none before, none after); the ps task serves each of them once.
    assert [s.number for s in traces["chief-0"].steps] == CHOSEN
    workers = [traces["worker-0"], traces["worker-1"]]
    assert all(t.step_source is StepSource.FUNCTION for t in workers)
    assert sum(len(t.steps) for t in workers) == len(CHOSEN)
    assert (traces["ps-0"].step_source, traces["ps-0"].served) == (StepSource.NONE, len(CHOSEN))
    # Each side's sends: TensorFlow 2.21's profiler records no event of the asynchronous _Recv kernel
    # (2.14's did), so the receiving half of the traffic is seen as the other task's _Send.
    for worker in workers:
        if worker.steps:  # its forward and backward pass and its gradients sent
            ops = _op_types(files[worker.task][0])
            assert {"_Send", "SparseSoftmaxCrossEntropyWithLogits"} <= ops
    ps_ops = _op_types(files["ps-0"][0])  # Adam's updates of the variables it holds, and their values sent
    assert {"ReadVariableOp", "AssignSubVariableOp", "_Send"} <= ps_ops
    assert "SparseSoftmaxCrossEntropyWithLogits" not in ps_ops


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_the_report_names_every_task_with_its_role_and_judges_the_workers(ps_profile, tmp_path, capsys):
    from tensorfleet import profiling
    from tensorfleet.cli.main import main
    from tensorfleet.profiling.breakdown import TaskRole

    profile = profiling.analyze(ps_profile)
    roles = {t.task: t.role for t in profile.tasks}
    assert roles == {"chief-0": TaskRole.COORDINATOR, "ps-0": TaskRole.PS, "worker-0": TaskRole.WORKER,
                     "worker-1": TaskRole.WORKER}
    ps = next(t for t in profile.tasks if t.role is TaskRole.PS)
    assert ps.steps == len(CHOSEN) and ps.compute_ms > 0
    for task in profile.tasks:
        if task.role is TaskRole.WORKER and task.steps:
            # No Python runs on a worker: its step is its ops, its input wait and the wait for the ps.
            assert task.idle_ms == 0.0 and task.exposed_communication_ms > 0
    # A 64-unit MLP computes in well under a millisecond; the workers spend their steps waiting for the ps.
    assert profile.verdict.bottleneck is profiling.Bottleneck.COMMUNICATION
    assert profile.verdict.straggler is None
    assert "ps task" in profile.verdict.advice
    assert main(["profile", "report", str(ps_profile), "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in table[2:6]] == [["chief-0", "coordinator"], ["ps-0", "ps"],
                                                        ["worker-0", "worker"], ["worker-1", "worker"]]
    assert table[3].split()[2] == str(len(CHOSEN))
