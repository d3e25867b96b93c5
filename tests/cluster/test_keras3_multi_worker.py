"""Keras 3 under multi_worker_mirrored: the trainer mends (keras-team/keras#20585), a user's ``import keras``
script launched on 2 workers, and fault tolerance with Keras 3's callbacks (a worker killed, the job resumed)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorfleet import testing
from tensorfleet.cluster import fault_tolerance as ft
from tensorfleet.cluster.launcher import Recovery, TaskCommand, TaskOutput, Timeouts, launch
from tensorfleet.compat import keras3 as mends
from tensorfleet.testing import Fault
from tests.conftest import user_env

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("keras3_mwms_job.py")
TIMEOUT = 240


# ---------------------------------------------------------------- the mends, in process


@pytest.fixture
def unmended(keras3: Any) -> Any:
    """Keras 3's trainer as it ships, whatever an earlier test built; put back as it was found afterwards."""
    was = mends.fit_mended()
    mends.restore_fit()
    yield keras3
    mends.restore_fit()
    if was:
        mends.mend_fit()


def test_mends_install_once_and_restore(unmended: Any) -> None:
    from keras.src.backend.tensorflow import trainer

    def installed() -> tuple[Any, ...]:
        return (trainer.TensorFlowTrainer._maybe_symbolic_build, trainer.reduce_per_replica,
                unmended.callbacks.ModelCheckpoint._save_model)

    own = installed()
    assert mends.mend_fit() is True
    mended = installed()
    assert all(getattr(f, "tensorfleet_mend", False) for f in mended)
    assert mends.mend_fit() is True  # idempotent: nothing wrapped twice
    assert installed() == mended
    mends.restore_fit()
    assert installed() == own
    assert not mends.fit_mended()


def test_a_version_not_checked_is_left_as_it_is_and_said(unmended: Any, monkeypatch, caplog) -> None:
    from keras.src.backend.tensorflow import trainer

    monkeypatch.setattr(mends, "CHECKED_VERSIONS", ("3.99",))
    with caplog.at_level(logging.WARNING, logger=mends.__name__):
        assert mends.mend_fit() is False
    assert not getattr(trainer.reduce_per_replica, "tensorfleet_mend", False)
    assert caplog.messages == [
        f"Keras {unmended.__version__} is not a version tensorfleet checked its multi-worker fit mends on (3.99.x): "
        "its TensorFlow trainer is left as it is. If fit fails under multi_worker_mirrored with 'PerReplica ... to a "
        "Tensor' or 'Invalid reduction dimension 0', that is keras-team/keras#20585; use Keras 3.99."]


def test_mended_reductions_leave_one_worker_strategies_to_keras(unmended: Any, logical_cpus: list[str]) -> None:
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    import tensorfleet as tfl

    mends.mend_fit()
    strategy = tfl.strategies.build("mirrored", devices=logical_cpus[:2])
    values = strategy.run(lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, "float32"))
    assert float(trainer.reduce_per_replica({"loss": values}, strategy, "auto")["loss"]) == 0.5
    assert trainer.reduce_per_replica(values, strategy, "concat").numpy().tolist() == [0.0, 1.0]


SCRIPT = textwrap.dedent("""
    import keras
    import tensorfleet as tfl
    from tensorfleet.compat import keras3
    from keras.src.backend.tensorflow import trainer

    def mended():
        return bool(getattr(trainer.reduce_per_replica, "tensorfleet_mend", False))

    seen = [mended()]
    tfl.strategies.build("one_device")
    seen.append(mended())
    tfl.strategies.build("multi_worker_mirrored")
    seen.append(mended())
    keras3.restore_fit()
    seen.append(mended())
    print(seen)
""")


@pytest.mark.slow
def test_only_building_a_multi_worker_strategy_mends_and_never_the_import() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=user_env(TF_CONFIG=""), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[False, False, True, False]"


# ---------------------------------------------------------------- Keras 3's callbacks, in process


def test_callbacks_are_the_keras_of_the_model(keras3: Any, tmp_path: Path) -> None:
    import tf_keras

    model = keras3.Sequential([keras3.Input((2,)), keras3.layers.Dense(1)])
    cbs = ft.callbacks(tmp_path / "b", best_model=tmp_path / "best.keras", log_steps=True, keras=model)
    assert [type(c).__name__ for c in cbs] == ["BackupAndRestore", "BestModelCheckpoint", "StepLog"]
    assert all(isinstance(c, keras3.callbacks.Callback) for c in cbs)
    assert isinstance(cbs[0], keras3.callbacks.BackupAndRestore) and cbs[0].backup_dir == str(tmp_path / "b")
    assert type(cbs[2]) is ft.callback_class("StepLog", "keras3")
    assert isinstance(cbs[2], ft.callback_class("EpochLog", "keras3"))
    assert [type(c) for c in ft.callbacks(tmp_path / "b", keras="keras3")] == [
        type(cbs[0]), ft.callback_class("EpochLog", model)]
    # The suite's process is a user's default one (`tf.keras` is Keras 3): by default the callbacks are Keras 3's,
    # and by name tf_keras's.
    assert all(isinstance(c, keras3.callbacks.Callback) for c in ft.callbacks(tmp_path / "b"))
    assert ft.EpochLog is ft.callback_class("EpochLog", "keras3")
    tf_keras_callbacks = ft.callbacks(tmp_path / "b", keras="tf_keras")
    assert all(isinstance(c, tf_keras.callbacks.Callback) for c in tf_keras_callbacks)
    assert type(tf_keras_callbacks[-1]) is ft.callback_class("EpochLog", "keras2")


def test_keras3_callbacks_refuse_what_they_cannot_do(keras3: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^save_freq must be 'epoch' for a Keras 3 model: Keras 3's BackupAndRestore "
                                         r"restores the epoch .* Received: save_freq=5$"):
        ft.callbacks(tmp_path, save_freq=5, keras="keras3")
    with pytest.raises(TypeError, match=r"^fault_tolerance\.callbacks takes a Keras model \(Keras 3 or tf_keras\)\. "
                                        r"Received: model of type object$"):
        ft.callbacks(tmp_path, keras=object())
    with pytest.raises(ValueError, match=r"^keras must be one of 'keras3', 'keras2' .* Received: keras='keras4'$"):
        ft.callbacks(tmp_path, keras="keras4")
    with pytest.raises(ValueError, match=r"^name must be one of \['BackupCleanup', .*\]\. Received: name='Log'$"):
        ft.callback_class("Log", "keras3")


def test_callbacks_of_the_other_keras_are_one_clear_error(keras3: Any, tmp_path: Path) -> None:
    model = keras3.Sequential([keras3.Input((2,)), keras3.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(TypeError, match=r"^EpochLog is a keras2 callback and fit's model is a keras3 model\. Received: "
                                        r"model of type keras\.src\.models\.sequential\.Sequential; pass keras=model "
                                        r"to tensorfleet\.cluster\.fault_tolerance\.callbacks"):
        model.fit(np.zeros((8, 2)), np.zeros((8, 1)), verbose=0, callbacks=ft.callbacks(tmp_path, keras="keras2"))


def _keras3_fit(keras: Any, x: np.ndarray, y: np.ndarray, callbacks: list, epochs: int = 4) -> Any:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, batch_size=64, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model


def test_keras3_backup_resumes_an_interrupted_fit_to_the_uninterrupted_weights(
        keras3: Any, digits_flat: Any, tmp_path: Path, capsys) -> None:
    x, y = digits_flat.x_train[:256], digits_flat.y_train[:256]
    seen: list[list[str]] = []

    class Interrupt(keras3.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if epoch == 2:
                seen.append(sorted(os.listdir(tmp_path / "b")))
                raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        _keras3_fit(keras3, x, y, [*ft.callbacks(tmp_path / "b", keras="keras3"), Interrupt()])
    # The metadata names the one weights file it was written with; the previous epoch's is gone.
    assert seen == [["backup-2.weights.h5", "training_metadata.json"]]
    assert json.loads((tmp_path / "b" / "training_metadata.json").read_text()) == {
        "epoch": 2, "batch": 0, "weights": "backup-2.weights.h5", "generation": 2}
    capsys.readouterr()
    resumed = _keras3_fit(keras3, x, y, ft.callbacks(tmp_path / "b", keras="keras3"))
    assert ft.resumed_epoch(capsys.readouterr().out.splitlines()) == 3
    assert sorted(os.listdir(tmp_path / "b")) == []  # the files removed at the end; the named directory stays
    clean = _keras3_fit(keras3, x, y, [])
    for a, b in zip(clean.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- 2 launched workers


def _launch_cli(out: Path, *args: str) -> str:
    """``tensorfleet launch --workers 2 JOB -- OUT ARGS`` in a user's environment (tf.keras is Keras 3, temporary
    files in OUT/tmp); a launcher still running at the bound is stopped with SIGTERM (which it passes to its
    tasks), then killed."""
    command = [sys.executable, "-m", "tensorfleet.cli.main", "launch", "--workers", "2", "--timeout", str(TIMEOUT - 60),
               str(JOB), "--", str(out), *args]
    (out / "tmp").mkdir()
    process = subprocess.Popen(command, cwd=ROOT, env=user_env(TF_CONFIG="", TMPDIR=str(out / "tmp")),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output = process.communicate(timeout=TIMEOUT)[0]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        raise
    assert process.returncode == 0, output[-4000:]
    return output


def _one_process(out: Path, *args: str) -> dict[str, Any]:
    """The job in one process (``--one-process``), in a user's environment: its results."""
    done = subprocess.run([sys.executable, str(JOB), str(out), "--one-process", *args], cwd=ROOT,
                          env=user_env(TF_CONFIG=""), capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads((out / "one-process.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, Any]:
    """2 launched workers (with Keras 3's ``ModelCheckpoint`` and tensorfleet's ``checkpoint_callback`` into
    ``OUT/checkpoints``) and one process, 3 epochs each: their results, and ``"out"``."""
    out = tmp_path_factory.mktemp("keras3-mwms")
    _launch_cli(out, "--checkpoints", str(out / "checkpoints"))
    results = {name: json.loads((out / f"{name}.json").read_text()) for name in ("worker0", "worker1")}
    return {**results, "one-process": _one_process(out), "out": out}


def _largest_difference(a: list[list[float]], b: list[list[float]]) -> float:
    return max(float(np.abs(np.asarray(u) - np.asarray(v)).max()) for u, v in zip(a, b))


def _assert_resumed_to(resumed: dict[str, Any], uninterrupted: dict[str, Any]) -> None:
    """``resumed`` (a run's results) ended with the uninterrupted run's step count and weights (float32 apart)."""
    assert resumed["iterations"] == uninterrupted["iterations"] == 3 * 8
    difference = _largest_difference(resumed["weights"], uninterrupted["weights"])
    print(f"largest weight difference to the uninterrupted run: {difference}")
    for a, b in zip(resumed["weights"], uninterrupted["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_two_launched_workers_fit_a_keras3_model_as_one_process_does(uninterrupted: dict[str, Any]) -> None:
    first, second, one = uninterrupted["worker0"], uninterrupted["worker1"], uninterrupted["one-process"]
    assert [first["task"], second["task"]] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert first["replicas"] == second["replicas"] == 2
    assert first["iterations"] == second["iterations"] == one["iterations"] == 3 * 8
    assert len(first["weights"]) == 4
    assert _largest_difference(first["weights"], second["weights"]) == 0.0  # one all-reduced update for both
    difference = _largest_difference(first["weights"], one["weights"])
    print(f"largest weight difference, 2 workers vs one process: {difference}")
    for a, b in zip(first["weights"], one["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for result in (first, second):
        # Logged loss and metrics, evaluate and predict over the workers: what one process reports.
        for name, values in one["history"].items():
            np.testing.assert_allclose(result["history"][name], values, rtol=1e-5, atol=1e-6)
        assert result["evaluate"] == pytest.approx(one["evaluate"], rel=1e-5, abs=1e-6)
        assert result["predict_rows"] == one["predict_rows"] == 359
        assert result["predict_accuracy"] == one["predict_accuracy"] == pytest.approx(
            one["evaluate"]["accuracy"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(3 * TIMEOUT)
def test_keras3_checkpoints_of_two_workers_are_the_chiefs_and_resume_to_the_uninterrupted_weights(
        uninterrupted: dict[str, Any], tmp_path: Path) -> None:
    import tensorflow as tf

    out = uninterrupted["out"]
    checkpoints = out / "checkpoints"
    keras_files = [str(checkpoints / f"epoch-{epoch}.keras") for epoch in (1, 2, 3)]
    assert uninterrupted["worker0"]["saved"] == keras_files  # the chief saved where the user asked ...
    # ... worker 1 saved too (saving reads sync-on-read variables, a collective), each time into a scratch folder
    # of its own, removed afterwards; Keras 3.15's own ModelCheckpoint wrote the chief's files from both.
    scratch = [Path(path) for path in uninterrupted["worker1"]["saved"]]
    assert [p.name for p in scratch] == [f"epoch-{epoch}.keras" for epoch in (1, 2, 3)]
    assert all(p.parent.parent == out / "tmp" and p.parent.name.startswith("tensorfleet-checkpoint-worker-")
               for p in scratch), scratch
    assert sorted(os.listdir(out / "tmp")) == []
    assert sorted(os.listdir(checkpoints)) == ["epoch-1.keras", "epoch-2.keras", "epoch-3.keras", "tf"]
    assert sorted(os.listdir(checkpoints / "tf")) == ["checkpoint"] + [
        f"ckpt-{n}.{part}" for n in (1, 2, 3) for part in ("data-00000-of-00001", "index")]
    # The chief's last TensorFlow checkpoint holds the final weights; resuming from epoch 2's .keras file (its
    # optimizer too) for the third epoch, in one process, ends where the 2 workers ended.
    reader = tf.train.load_checkpoint(str(checkpoints / "tf" / "ckpt-3"))
    assert int(reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == 3 * 8
    _assert_resumed_to(_one_process(tmp_path, "--resume", keras_files[1]), uninterrupted["worker0"])


# What the launchers' tasks get: this process's environment plus TF_USE_LEGACY_KERAS=0, a user's (tf.keras is Keras 3),
# as user_env() makes it for a child started here.
TASKS = {"timeouts": Timeouts(timeout=TIMEOUT - 60), "output": TaskOutput(log=None),
         "command": TaskCommand(env={"TF_USE_LEGACY_KERAS": "0"})}


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_a_killed_keras3_worker_resumes_to_the_uninterrupted_weights(
        uninterrupted: dict[str, Any], tmp_path: Path) -> None:
    with testing.faults(Fault("worker:1", r"^tensorfleet: epoch 2 step 3$", signal=signal.SIGKILL)):
        result = launch(JOB, [str(tmp_path), "--fault-tolerant"], workers=2, **TASKS, recovery=Recovery(
            max_restarts=1, backoff=0.5, backup_dir=tmp_path / "backup"))
    assert result.returncode == 0 and result.restarts == 1
    for task in ("worker:0", "worker:1"):
        assert ft.resumed_epoch(result.output(task, attempt=0)) is None
        assert ft.resumed_epoch(result.output(task, attempt=1)) == 2
    _assert_resumed_to(json.loads((tmp_path / "worker0.json").read_text()), uninterrupted["worker0"])
    assert sorted(os.listdir(tmp_path / "backup")) == []  # the chief removed its backup's files at the end


@pytest.mark.slow
@pytest.mark.timeout(3 * TIMEOUT)
def test_a_keras3_job_stopped_at_2_workers_continues_at_1_and_back_at_2(
        uninterrupted: dict[str, Any], tmp_path: Path) -> None:
    from tensorfleet.cluster.elastic import ElasticPhase, launch_elastic

    results = launch_elastic(JOB, [str(tmp_path), "--fault-tolerant"], backup_dir=tmp_path / "backup", **TASKS, phases=[
        ElasticPhase(workers=2, until_epoch=1), ElasticPhase(workers=1, until_epoch=2), ElasticPhase(workers=2)])
    assert [(r.stopped, r.returncode, r.cluster.num_tasks()) for r in results] == [(True, 0, 2), (True, 0, 1),
                                                                                    (False, 0, 2)]
    assert [ft.resumed_epoch(r.output("worker:0")) for r in results] == [None, 2, 3]
    # The global batch is 64 in every phase; one worker sums its gradient in another order than two.
    _assert_resumed_to(json.loads((tmp_path / "worker0.json").read_text()), uninterrupted["worker0"])
