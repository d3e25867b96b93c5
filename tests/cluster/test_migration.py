"""Migration of a Keras job between world sizes and strategies, with real processes on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import re
import signal
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from tensorfleet import testing
from tensorfleet.cluster.contract import STOPPED_STATUS
from tensorfleet.cluster.jobstate import CheckpointError, epoch_order, latest, read_state, tf_checkpoint_prefix
from tensorfleet.cluster.migration import MigrationError, Placement, RunOptions, check_migration, migrate
from tensorfleet.testing import Fault

HERE = Path(__file__).parent
JOB = HERE / "migrating_job.py"
EXAMPLES, BATCH = 96, 8  # 12 steps an epoch
COUNTS = "counts/.ATTRIBUTES/VARIABLE_VALUE"
ITERATIONS = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"


def _saved(directory: Path) -> tuple:
    import tensorflow as tf

    state, path = read_state(directory)
    reader = tf.train.load_checkpoint(tf_checkpoint_prefix(path))
    return state, reader.get_tensor(COUNTS), int(reader.get_tensor(ITERATIONS))


def _expected_counts(step: int, epochs_order: list[np.ndarray]) -> np.ndarray:
    """How often each example id is read by ``step`` when every epoch reads its order once."""
    counts = np.zeros(EXAMPLES, np.float32)
    done = step * BATCH
    for order in epochs_order:
        take = order[:min(done, EXAMPLES)]
        counts[take] += 1
        done -= len(take)
    return counts


def _digest(directory: Path) -> str:
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Mirrored 2 -> multi-worker mirrored 2 -> parameter server 2 workers x 1 ps -> the mesh's data-parallel
    layout over 2 devices -> mirrored 1, two epochs.

    The first move is SIGKILLed while it writes its checkpoint: the next placement continues from
    whatever checkpoint was last complete. The parameter-server phase is stopped by a SIGTERM to the
    launcher (this process) while its chief waits at a gate after step 17: the launcher forwards it to
    every task, the servers outlive it, the chief saves and the launcher exits 75.
    """
    directory = tmp_path_factory.mktemp("migration") / "ckpt"
    gate = directory.parent / "gate"
    gate.write_text("6")  # the parameter-server phase may do steps 12-17, then waits
    phases = [(Placement("mirrored", devices=2), 5, [Fault("worker:0", r"saving step 5$")], None),
              (Placement("multi_worker_mirrored", workers=2), 11, [], None),
              (Placement("parameter_server", workers=2, ps=1), None, [], str(gate)),
              (Placement("mesh", devices=2), 21, [], None),
              (Placement("mirrored"), None, [], None)]
    record: dict = {"directory": directory, "phases": []}
    for to, stop, faults, gated in phases:
        with testing.faults(*faults):
            result = migrate(JOB, directory, to=to, run=RunOptions(epochs=2, global_batch_size=BATCH, save_every=1,
                                                                   stop_at_step=stop, gate=gated),
                             check=False, timeout=240, log=_signal_self_after(r"\[chief:0\] .* step 17 done"))
        record["phases"].append((result, *_saved(directory)))
    return record


def _signal_self_after(pattern: str) -> Callable[[str], None]:
    """A log that sends SIGTERM to this process (the launcher, forwarding it) at the first line matching."""
    sent: list[bool] = []

    def log(line: str) -> None:
        if not sent and re.search(pattern, line):
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)

    return log


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chain_reads_every_example_once_and_continues_adam(chain: dict) -> None:
    import tensorfleet.cluster.jobstate as jobstate

    first = jobstate.new_rng_state(0)
    order1, after = epoch_order(first, EXAMPLES)
    order2, _ = epoch_order(after, EXAMPLES)
    (killed, s1, c1, i1), (mwms, s2, c2, i2), (ps, s3, c3, i3), (mesh, s5, c5, i5), (last, s4, c4, i4) = \
        chain["phases"]
    assert killed.returncode == 128 + 9 and "was killed by SIGKILL" in (killed.error or "")
    assert s1.step in (4, 5) and i1 == s1.step  # the killed save left the one before it, or had just finished
    np.testing.assert_array_equal(c1, _expected_counts(s1.step, [order1]))
    assert mwms.stopped and ps.stopped and mesh.stopped and last.ok and not last.stopped
    assert (mwms.returncode, ps.returncode, mesh.returncode) == (0, STOPPED_STATUS, 0)
    assert "stopping at step 17 to move (received SIGTERM)" in "\n".join(ps.output("chief:0"))
    assert [e.text for e in ps.events][-2:] == [
        "received SIGTERM; stopping all tasks",
        f"the job stopped to move (every trainer exited with status {STOPPED_STATUS} after the signal)"]
    for state, counts, iterations, step, strategy, replicas in (
            (s2, c2, i2, 11, "multi_worker_mirrored", 2), (s3, c3, i3, 17, "parameter_server", 1),
            (s5, c5, i5, 21, "mesh", 2), (s4, c4, i4, 24, "mirrored", 1)):
        assert (state.step, iterations, state.strategy, state.replicas) == (step, step, strategy, replicas)
        np.testing.assert_array_equal(counts, _expected_counts(step, [order1, order2]))
    assert (s4.epoch, s4.position) == (2, 0) and set(c4.tolist()) == {2.0}
    assert [h["strategy"] for h in s4.history] == ["mirrored", "multi_worker_mirrored", "parameter_server", "mesh",
                                                   "mirrored"]
    assert [h["step"] for h in s4.history] == [0, s1.step, 11, 17, 21]
    assert f"resumed at step {s1.step} (epoch 1" in "\n".join(mwms.output("worker:1"))
    assert "resumed at step 11 (epoch 1, example 88 of 96)" in "\n".join(ps.output("chief:0"))
    assert "resumed at step 17 (epoch 2, example 40 of 96) from parameter_server over 1 replica(s); optimizer " \
           "step 17" in "\n".join(mesh.output("worker:0"))
    assert "optimizer step 21" in "\n".join(last.output("worker:0"))


@pytest.mark.slow  # its `chain` fixture launches the migrating job
def test_bad_migrations_fail_before_start_and_leave_the_checkpoint(chain: dict, tmp_path: Path) -> None:
    directory = chain["directory"]
    before = _digest(directory)
    run = RunOptions(epochs=2, global_batch_size=BATCH)
    with pytest.raises(MigrationError, match=r"mirrored over 3 device\(s\) cannot take the job's batch: "
                       r"global_batch_size must be divisible .* Received: global_batch_size=8, replicas=3"):
        migrate(JOB, directory, to=Placement("mirrored", devices=3), run=run)
    other = tmp_path / "other_job.py"
    other.write_text(JOB.read_text().replace("Dense(16", "Dense(32"))
    with pytest.raises(CheckpointError, match="is of another model"):
        migrate(other, directory, to=Placement("mirrored"), run=run)
    with pytest.raises(MigrationError, match=r"parameter_server with 2 worker\(s\) and 1 ps cannot hold the model: "
                       r"1,210 parameters need about 14,520 bytes"):
        migrate(JOB, directory, to=Placement("parameter_server", workers=2, ps=1), run=run, memory_bytes=10_000)
    with pytest.raises(MigrationError,
                       match=r"the mesh's data-parallel layout over 5 device\(s\) cannot take the job's "
                       r"batches: an epoch of 96 examples ends with a batch of 6, which its 5 devices cannot split"):
        migrate(JOB, directory, to=Placement("mesh", devices=5), run=RunOptions(epochs=2, global_batch_size=10))
    with pytest.raises(CheckpointError, match="No migration checkpoint to resume from"):
        migrate(JOB, tmp_path / "empty", to=Placement("mirrored"), run=run, resume=True)
    assert _digest(directory) == before
    assert not (tmp_path / "empty").exists()


def test_placement_rejects_what_its_strategy_cannot_run() -> None:
    with pytest.raises(MigrationError, match=r"strategy='parameter_server' needs at least one ps task. Received: ps=0"):
        Placement("parameter_server", workers=2)
    with pytest.raises(MigrationError, match=r"Received: workers=2; use 'multi_worker_mirrored'"):
        Placement("mirrored", workers=2)
    with pytest.raises(MigrationError, match=r"strategy='mesh' runs in one process over local devices"):
        Placement("mesh", workers=2)
    with pytest.raises(ValueError, match="strategy"):
        Placement("central_storage")
    assert [Placement("mirrored", devices=4).replicas, Placement("multi_worker_mirrored", workers=3).replicas,
            Placement("parameter_server", workers=2, ps=1).replicas] == [4, 3, 1]
    assert check_migration("unused", to=Placement("mirrored", devices=2), run=RunOptions(global_batch_size=8),
                           resume=False) is None
    assert latest("unused") is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--strategy", "mirrored"], "error: A migratable job (--strategy) keeps its checkpoints in a directory: give "
                                 "--checkpoint-dir DIR to start one, or --resume-from DIR to continue one."),
    (["--resume-from", "EMPTY"], "error: No migration checkpoint to resume from in "),
    (["--checkpoint-dir", "EMPTY"], "error: --checkpoint-dir starts a migratable job: give its --strategy too."),
    (["--strategy", "parameter_server", "--checkpoint-dir", "EMPTY"],
     "error: strategy='parameter_server' needs at least one ps task. Received: ps=0"),
])
def test_launch_refuses_a_bad_migration_with_one_error(tmp_path: Path, capsys, argv: list, message: str) -> None:
    from tensorfleet.cli.main import main

    argv = [str(tmp_path / "empty") if a == "EMPTY" else a for a in argv]
    assert main(["launch", *argv, str(JOB)]) == 2
    assert capsys.readouterr().err.startswith(message)
    assert not (tmp_path / "empty").exists()


def test_launch_mode_is_a_choice_typer_checks(capsys) -> None:
    from tensorfleet.cli.main import main

    assert main(["launch", "--mode", "ring", str(JOB)]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--mode'" in err
    assert "'ring' is not one of 'auto', 'collective', 'parameter_server'." in err


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_restarted_job_continues_from_its_last_checkpoint(tmp_path: Path) -> None:
    """``max_restarts``: a job started fresh and killed after its checkpoint of step 4 is restarted, and the
    restarted task continues from the newest checkpoint (not from step 0): every example read once."""
    from tensorfleet.cluster.contract import RESUMED, SAVED

    directory = tmp_path / "ckpt"
    with testing.faults(Fault("worker:0", SAVED.pattern(step=4))):
        result = migrate(JOB, directory, to=Placement("mirrored"), run=RunOptions(global_batch_size=BATCH,
                         save_every=1), max_restarts=1, backoff=0, check=False, timeout=240)
    assert (result.returncode, result.restarts) == (0, 1)
    assert not [line for line in result.output("worker:0", attempt=0) if RESUMED.read(line)]
    resumed = [found for line in result.output("worker:0", attempt=1) if (found := RESUMED.read(line))]
    assert len(resumed) == 1 and resumed[0]["step"] >= 4
    step = resumed[0]["step"]
    assert resumed[0] == {"step": step, "epoch": 1, "position": step * BATCH, "examples": EXAMPLES,
                          "strategy": "mirrored", "replicas": 1, "iterations": step}
    state, counts, iterations = _saved(directory)
    assert (state.step, iterations) == (12, 12)
    np.testing.assert_array_equal(counts, np.ones(EXAMPLES, np.float32))
