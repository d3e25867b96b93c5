"""Migratable jobs whose build_model() returns a Keras 3 model: trained by the cluster room's own step loops under
mirrored, multi-worker mirrored and a parameter server (Keras 3's own fit has no parameter-server training,
keras-team/keras#18624), moved between them, balanced and shared, with real processes on 127.0.0.1."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorfleet.cluster.jobstate import CheckpointError, read_state, tf_checkpoint_prefix
from tensorfleet.cluster.migration import MigrationError, Placement, RunOptions, migrate

HERE = Path(__file__).parent
JOB, KERAS2_JOB = HERE / "keras3_job.py", HERE / "migrating_job.py"
COUNTS = "counts/.ATTRIBUTES/VARIABLE_VALUE"
ITERATIONS = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"
RUN = RunOptions(epochs=2, global_batch_size=8, save_every=1)  # 12 steps an epoch, 24 in all


def _saved(directory: Path) -> tuple[Any, dict[str, np.ndarray]]:
    import tensorflow as tf

    state, path = read_state(directory)
    reader = tf.train.load_checkpoint(tf_checkpoint_prefix(path))
    return state, {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k[0] != "_"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, keras3: Any) -> dict[str, Path]:
    """An unbroken run on one device; the same job moved mirrored over 2 devices (to step 6) -> multi-worker
    mirrored over 2 processes (to 12) -> parameter server, 2 workers and 1 ps (to 18) -> one device (to the end).

    The parameter-server phase is gated (the chief waits for each step before it schedules the next), so its
    steps apply one after another as one process's do: the same maths, float32 rounding apart."""
    root = tmp_path_factory.mktemp("keras3_jobs")
    gate = root / "gate"
    gate.write_text("1000")
    migrate(JOB, root / "unbroken", to=Placement("mirrored"), run=RUN, timeout=240)
    moved = root / "moved"
    for to, stop, gated in ((Placement("mirrored", devices=2), 6, None),
                            (Placement("multi_worker_mirrored", workers=2), 12, None),
                            (Placement("parameter_server", workers=2, ps=1), 18, str(gate)),
                            (Placement("mirrored"), None, None)):
        result = migrate(JOB, moved, to=to, run=RunOptions(**{**RUN.__dict__, "stop_at_step": stop, "gate": gated}),
                         timeout=240)
        assert result.ok or result.stopped, result.error
    return {"unbroken": root / "unbroken", "moved": moved}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_keras3_job_moves_across_strategies_and_equals_an_unbroken_run(runs: dict[str, Path]) -> None:
    unbroken_state, unbroken = _saved(runs["unbroken"])
    state, moved = _saved(runs["moved"])
    assert (unbroken_state.keras, state.keras) == ("keras3", "keras3")
    assert [(h["step"], h["strategy"], h["replicas"]) for h in state.history] == [
        (0, "mirrored", 2), (6, "multi_worker_mirrored", 2), (12, "parameter_server", 1), (18, "mirrored", 1)]
    assert sorted(moved) == sorted(unbroken)
    assert int(moved[ITERATIONS]) == int(unbroken[ITERATIONS]) == state.step == 24
    assert set(moved[COUNTS].tolist()) == {2.0}  # every example read exactly once an epoch, across the moves
    for name, value in unbroken.items():
        if value.dtype.kind == "f":  # the same updates, the replicas' sums grouped otherwise: float32 apart
            np.testing.assert_allclose(moved[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_keras3_parameter_server_workers_take_batches_by_speed_and_read_every_example_once(
        tmp_path: Path, keras3: Any) -> None:
    run = RunOptions(epochs=2, global_batch_size=8, balance=True, input_delay=0.004, slowdown=(1.0, 4.0))
    result = migrate(JOB, tmp_path, to=Placement("parameter_server", workers=2, ps=1), run=run, timeout=280)
    log = "\n".join(result.output("chief:0"))
    splits = [[int(v) for v in m.split(", ")] for m in re.findall(r"worker batches \[(\d+, \d+)\]", log)]
    assert splits and all(sum(s) == 16 and s[0] > s[1] for s in splits), splits
    per_worker = [int(v) for v in re.findall(r"epoch 2/2 end .* examples per worker \[(\d+), (\d+)\]", log)[0]]
    assert sum(per_worker) == 2 * 96 and per_worker[0] > per_worker[1], per_worker
    state, saved = _saved(tmp_path)
    assert set(saved[COUNTS].tolist()) == {2.0} and int(saved[ITERATIONS]) == state.step


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_keras3_jobs_share_the_devices(tmp_path: Path, keras3: Any) -> None:
    from tensorfleet.cluster.multiplex import SharedJob, share

    run = RunOptions(epochs=2, global_batch_size=8)
    result = share([SharedJob(JOB, tmp_path / "a", Placement("mirrored"), run, share=0.75),
                    SharedJob(JOB, tmp_path / "b", Placement("mirrored"), run, share=0.25)], quantum=4, timeout=280)
    assert [r.returncode for r in result.results] == [0, 0]
    assert [len(times) for times in result.steps] == [24, 24]
    shares = result.shares()
    assert abs(shares[0] - 0.75) <= 0.05 and abs(shares[1] - 0.25) <= 0.05, shares


@pytest.mark.slow  # its checkpoint comes from the module's runs
@pytest.mark.timeout(600)
def test_a_checkpoint_moves_between_placements_not_between_kerases(runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=rf"^The checkpoint in '{re.escape(str(runs['unbroken']))}' was written "
                       r"by a Keras 3 model and this job's build_model\(\) returns a Keras 2 \(tf_keras\) model: a "
                       r"job moves between placements, not between Kerases\."):
        migrate(KERAS2_JOB, runs["unbroken"], to=Placement("mirrored"), run=RUN, resume=True)


def test_the_mesh_refuses_a_keras3_job_before_anything_starts(tmp_path: Path, keras3: Any) -> None:
    with pytest.raises(MigrationError, match=r"^the mesh's data-parallel layout over 2 device\(s\) runs Keras 2 "
                       r"\(tf_keras\) models only for now .* returns a Keras 3 model \(keras\.src\.models\.sequential\."
                       r"Sequential\)\. Move a Keras 3 job between mirrored, multi_worker_mirrored and "
                       r"parameter_server, or build it with tf_keras"):
        migrate(JOB, tmp_path / "never", to=Placement("mesh", devices=2), run=RUN)
    assert not (tmp_path / "never").exists()
