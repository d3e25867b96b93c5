"""Migratable jobs whose build_model() returns a Keras 3 model: trained by the cluster room's own step loops under
mirrored, multi-worker mirrored and a parameter server (Keras 3's own fit has no parameter-server training,
keras-team/keras#18624), moved between them, balanced and shared, with real processes on 127.0.0.1."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorfleet.cluster.jobstate import CheckpointError, read_state, tf_checkpoint_prefix
from tensorfleet.cluster.migration import MigrationError, Placement, RunOptions, migrate

HERE = Path(__file__).parent
JOB, KERAS2_JOB, STATE_JOB = HERE / "keras3_job.py", HERE / "migrating_job.py", HERE / "keras3_state_job.py"
COUNTS = "counts/.ATTRIBUTES/VARIABLE_VALUE"
ITERATIONS = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"
SEEDS = "seeds/0/.ATTRIBUTES/VARIABLE_VALUE"  # the state of the model's first seed generator (Dropout's)
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
def test_keras3_batchnorm_and_dropout_state_counts_every_step_of_concurrent_parameter_server_workers(
        tmp_path: Path, keras3: Any) -> None:
    # Ungated: the two workers' steps overlap. Keras 3's own read-then-assign lost updates here (measured at 48
    # steps: the seed advanced 43 times, the moving mean moved as 42 steps would move it).
    run = RunOptions(epochs=2, global_batch_size=4)  # 24 steps an epoch
    result = migrate(STATE_JOB, tmp_path, to=Placement("parameter_server", workers=2, ps=1), run=run, timeout=280)
    assert result.ok, result.error
    state, saved = _saved(tmp_path)
    steps = state.step
    assert steps == 48 and int(saved[ITERATIONS]) == steps
    assert saved[SEEDS].tolist() == [7, steps]  # advanced once a step, exactly
    mean, variance = (next(v for k, v in saved.items() if k.endswith(f"/{name}/.ATTRIBUTES/VARIABLE_VALUE"))[0]
                      for name in ("moving_mean", "moving_variance"))
    # How many steps' updates the feature that is 1.0 everywhere shows (1 - 0.95**n, 0.95**n). Each update is
    # applied; one computed from a read that the other worker's update follows moves a little more, never less.
    moved = [np.log(1.0 - mean) / np.log(0.95), np.log(variance) / np.log(0.95)]
    assert all(steps - 0.01 <= n < steps + 5 for n in moved), moved


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_resumed_keras3_job_draws_dropout_masks_where_it_stopped(tmp_path: Path, keras3: Any) -> None:
    # Before the seed generators' states were saved, the resumed run drew step 7's masks from the seed's start
    # again and ended up to 6e-3 from the unbroken run's weights.
    run = RunOptions(epochs=1, global_batch_size=8)  # 12 steps
    for directory, stops in ((tmp_path / "unbroken", (None,)), (tmp_path / "resumed", (6, None))):
        for stop in stops:
            result = migrate(STATE_JOB, directory, to=Placement("mirrored"),
                             run=RunOptions(**{**run.__dict__, "stop_at_step": stop}), timeout=240)
            assert result.ok or result.stopped, result.error
    (_, unbroken), (state, resumed) = _saved(tmp_path / "unbroken"), _saved(tmp_path / "resumed")
    assert [h["step"] for h in state.history] == [0, 6]
    assert unbroken[SEEDS].tolist() == resumed[SEEDS].tolist() == [7, 12]
    assert sorted(resumed) == sorted(unbroken)
    for name, value in unbroken.items():  # the same steps in the same order on one device
        np.testing.assert_allclose(resumed[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def _state_model(keras: Any, atomic: bool, renorm: bool = False) -> Any:
    from tensorfleet.compat.keras3_ps import make_updates_atomic

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(momentum=0.8, renorm=renorm),
                              keras.layers.Dropout(0.5, seed=3), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.optimizer.build(model.trainable_variables)
    if atomic:
        assert make_updates_atomic(model) == (1 if renorm else 2)  # the seed generator (and the BN layer)
    return model


def test_atomic_updates_train_as_keras3s_own_in_one_process(keras3: Any) -> None:
    import tensorflow as tf

    x = np.random.default_rng(0).normal(2.0, 3.0, (3, 8, 4)).astype("float32")
    states = []
    for atomic in (False, True):
        model = _state_model(keras3, atomic)
        step = tf.function(lambda batch, model=model: model(batch, training=True))
        outputs = [step(batch).numpy() for batch in x]
        model.optimizer.iterations.assign_add(1)
        states.append((outputs, [v.numpy() for v in model.non_trainable_variables], model.optimizer.iterations.numpy()))
    (own, own_state, own_count), (atomic_outputs, atomic_state, atomic_count) = states
    for a, b in zip(own + own_state, atomic_outputs + atomic_state):  # the same maths, the update written otherwise
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert own_state[-1].tolist() == atomic_state[-1].tolist() == [3, 3]  # the seed state, advanced once a call
    assert own_count == atomic_count == 1
    assert not np.allclose(own_state[0], 0.0)  # the moving mean moved


def test_a_renorm_batchnorm_keeps_keras3s_update_and_says_so(keras3: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tensorfleet.compat.keras3_ps"):
        model = _state_model(keras3, atomic=True, renorm=True)
    assert caplog.messages == [f"BatchNormalization {model.layers[0].name!r} has renorm=True: its statistics keep "
                               "Keras 3's own read-then-write update, which steps running at once on several workers "
                               "can lose."]


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
