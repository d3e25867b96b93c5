"""A migratable job stops on SIGTERM at a step boundary, every worker at the same step, and continues
bit-identically: real multi-worker mirrored processes on 127.0.0.1."""

from __future__ import annotations

import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tensorfleet import testing
from tensorfleet.cluster.contract import STOPPED_STATUS
from tensorfleet.cluster.jobstate import epoch_order, new_rng_state, read_state, tf_checkpoint_prefix
from tensorfleet.cluster.migration import Placement, RunOptions, migrate
from tensorfleet.testing import Fault

JOB = Path(__file__).parent / "migrating_job.py"
EXAMPLES, BATCH, GATE_STEPS = 96, 8, 5  # 12 steps an epoch; the job waits after step 5 until the gate opens
ITERATIONS = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"


def _tensors(directory: Path) -> dict:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf_checkpoint_prefix(read_state(directory)[1]))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map() if name[0] != "_"}


def _signalled_run(directory: Path, gate: Path) -> object:
    """Two workers, held at the gate after step 5; SIGTERM to worker 1 alone, then the gate opens."""
    gate.write_text(str(GATE_STEPS))
    opened = threading.Event()

    def log(line: str) -> None:  # the launcher's event comes just before its kill
        if line.startswith("[launcher] injecting fault") and not opened.is_set():
            opened.set()
            threading.Timer(1.0, gate.write_text, (str(10**6),)).start()

    run = RunOptions(epochs=1, global_batch_size=BATCH, gate=str(gate))
    with testing.faults(Fault("worker:1", rf"step {GATE_STEPS} done", signal=signal.SIGTERM)):
        return migrate(JOB, directory, to=Placement("multi_worker_mirrored", workers=2), run=run, log=log,
                       timeout=240)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_to_one_worker_stops_both_at_one_step_and_the_job_resumes_bit_identically(tmp_path: Path) -> None:
    to = Placement("multi_worker_mirrored", workers=2)
    with ThreadPoolExecutor(2) as pool:  # the unbroken run beside the signalled one
        unbroken = pool.submit(migrate, JOB, tmp_path / "unbroken", to=to,
                               run=RunOptions(epochs=1, global_batch_size=BATCH), timeout=240)
        stopped = _signalled_run(tmp_path / "moved", tmp_path / "gate")
        unbroken = unbroken.result()
    assert stopped.stopped and stopped.returncode == 0
    assert sorted(s.status for s in stopped.spans) == [STOPPED_STATUS, STOPPED_STATUS]
    lines = {task: "\n".join(stopped.output(task)) for task in ("worker:0", "worker:1")}
    steps = {task: re.findall(r"stopping at step (\d+) to move \((.+?)\)", text) for task, text in lines.items()}
    # Worker 0 got no signal: it stops where worker 1 does because the step's all-reduce told it.
    assert steps["worker:1"] == [(steps["worker:0"][0][0], "received SIGTERM")], steps
    assert steps["worker:0"][0][1] == "another task received a stop signal"
    state = read_state(tmp_path / "moved")[0]
    assert str(state.step) == steps["worker:0"][0][0] and GATE_STEPS < state.step < EXAMPLES // BATCH
    assert (state.epoch, state.position) == (0, state.step * BATCH)  # mid-epoch
    order, _ = epoch_order(new_rng_state(0), EXAMPLES)
    counts = _tensors(tmp_path / "moved")["counts/.ATTRIBUTES/VARIABLE_VALUE"]
    assert np.flatnonzero(counts).tolist() == sorted(order[:state.step * BATCH].tolist())
    assert int(_tensors(tmp_path / "moved")[ITERATIONS]) == state.step

    resumed = migrate(JOB, tmp_path / "moved", to=to, timeout=240)
    assert resumed.ok and not resumed.stopped
    assert f"resumed at step {state.step} (epoch 1, example {state.step * BATCH} of {EXAMPLES})" in \
        "\n".join(resumed.output("worker:0"))
    straight, moved = _tensors(tmp_path / "unbroken"), _tensors(tmp_path / "moved")
    assert sorted(straight) == sorted(moved) and len(moved) == 15
    assert int(moved[ITERATIONS]) == EXAMPLES // BATCH
    unequal = [name for name in straight if not np.array_equal(straight[name], moved[name])]
    assert unequal == []  # weights, Adam's slots and step, example counts: bit for bit



# A one-process placement takes the signal itself (no all-reduce to agree on): the mirrored job's steps are
# slowed (a wait in the step's input, seconds per example) so that the signal lands inside a step, which finishes
# before the stop; the mesh's steps are too short for that, so its job waits at a gate after step 5 and the signal
# lands there.
ONE_PROCESS = {
    "mirrored": (Placement("mirrored"), RunOptions(epochs=1, global_batch_size=BATCH),
                 Fault("worker:0", r"first step done", signal=signal.SIGTERM, delay=0.1), 0.03),
    "mesh": (Placement("mesh", devices=2), RunOptions(epochs=1, global_batch_size=BATCH, gate="GATE"),
             Fault("worker:0", rf"step {GATE_STEPS} done", signal=signal.SIGTERM), 0.0),
}


def _stop_and_resume(directory: Path, to: Placement, run: RunOptions, fault: Fault, delay: float) -> tuple:
    if run.gate:
        Path(run.gate).write_text(str(GATE_STEPS))
    with testing.faults(fault), testing.slow_inputs(delay):  # in this thread only: the unbroken runs go alongside
        stopped = migrate(JOB, directory, to=to, run=run, timeout=240)
    state, saved = read_state(directory)[0], _tensors(directory)  # complete and loadable, or this raises
    resumed = migrate(JOB, directory, to=to, run=RunOptions(epochs=1, global_batch_size=BATCH), timeout=240)
    return stopped, state, saved, resumed


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigterm_stops_one_process_jobs_at_a_step_and_they_resume_bit_identically(tmp_path: Path) -> None:
    from dataclasses import replace

    with ThreadPoolExecutor(4) as pool:  # both placements at once, each beside its unbroken run
        runs = {name: (pool.submit(migrate, JOB, tmp_path / f"{name}-unbroken", to=to,
                                   run=RunOptions(epochs=1, global_batch_size=BATCH), timeout=240),
                       pool.submit(_stop_and_resume, tmp_path / name, to,
                                   replace(run, gate=str(tmp_path / f"{name}-gate")) if run.gate else run, fault,
                                   delay))
                for name, (to, run, fault, delay) in ONE_PROCESS.items()}
        runs = {name: (unbroken.result(), moved.result()) for name, (unbroken, moved) in runs.items()}
    order, _ = epoch_order(new_rng_state(0), EXAMPLES)
    for name, (unbroken, (stopped, state, saved, resumed)) in runs.items():
        assert stopped.stopped and [s.status for s in stopped.spans] == [STOPPED_STATUS], name
        log = "\n".join(stopped.output("worker:0"))
        stops = re.findall(r"stopping at step (\d+) to move \(received SIGTERM\)", log)
        assert stops == [str(state.step)] and 1 <= state.step < EXAMPLES // BATCH, (name, stops, state.step)
        if name == "mesh":
            assert state.step == GATE_STEPS
        assert (state.epoch, state.position) == (0, state.step * BATCH), name  # mid-epoch, at a step's end
        assert np.flatnonzero(saved["counts/.ATTRIBUTES/VARIABLE_VALUE"]).tolist() == \
            sorted(order[:state.step * BATCH].tolist()), name
        assert int(saved[ITERATIONS]) == state.step, name
        assert unbroken.ok and resumed.ok and not resumed.stopped, name
        straight, moved = _tensors(tmp_path / f"{name}-unbroken"), _tensors(tmp_path / name)
        assert sorted(straight) == sorted(moved) == sorted(saved), name
        assert int(moved[ITERATIONS]) == EXAMPLES // BATCH, name
        unequal = [key for key in straight if not np.array_equal(straight[key], moved[key])]
        assert unequal == [], name  # the same steps in the same order of computation: bit for bit
