"""Fault tolerance: backup directory, atomic best-model checkpoints, and real processes that
are killed (multi-worker mirrored resumes from its backup; a parameter-server worker is
replaced while the coordinator carries on)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tensorfleet import testing
from tensorfleet.cluster import fault_tolerance as ft
from tensorfleet.cluster.launcher import Recovery, TaskOutput, Timeouts, launch
from tensorfleet.compat.keras import keras2
from tensorfleet.io import write_json
from tensorfleet.strategies.tf_config import ClusterSpec
from tensorfleet.testing import Fault

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


def _k2(name: str) -> type:
    """The fault-tolerance callback class ``name`` made for the tests' Keras 2."""
    return ft.callback_class(name, "keras2")


QUIET = TaskOutput(log=None)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


# ---------------------------------------------------------------- backup directory


def test_backup_dir_prefers_the_argument_then_the_environment(tmp_path: Path) -> None:
    env = {"TENSORFLEET_BACKUP_DIR": str(tmp_path / "from-env")}
    assert ft.backup_dir(tmp_path / "given", environ=env) == tmp_path / "given"
    assert ft.backup_dir(environ=env) == tmp_path / "from-env"


def test_backup_dir_is_the_same_for_every_task_of_a_job_and_differs_between_jobs() -> None:
    spec = ClusterSpec.local(workers=2, chief=True)
    dirs = {ft.backup_dir(environ={"TF_CONFIG": spec.tf_config_json(t.role, t.index)}) for t in spec.tasks()}
    assert len(dirs) == 1
    other = ClusterSpec.local(workers=2, chief=True)
    assert ft.backup_dir(environ={"TF_CONFIG": other.tf_config_json("worker", 0)}) not in dirs
    assert next(iter(dirs)).parent.name == "tensorfleet-backup"


def test_empty_backup_dir_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"^backup_dir must be a non-empty path\. Received: backup_dir=' '$"):
        ft.backup_dir(" ")


def test_callbacks_are_backup_then_best_model_then_log(tmp_path: Path) -> None:

    cbs = ft.callbacks(tmp_path / "backup", save_freq=5, best_model=tmp_path / "best.keras", keras="keras2")
    assert [type(c) for c in cbs] == [tf_keras.callbacks.BackupAndRestore, _k2("BestModelCheckpoint"), _k2("EpochLog")]
    assert cbs[0].backup_dir == str(tmp_path / "backup")
    assert cbs[0].save_freq == 5
    assert type(ft.callbacks(tmp_path / "b", log_steps=True, keras="keras2")[-1]) is _k2("StepLog")


def test_callbacks_add_a_planned_stop_when_the_environment_asks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORFLEET_STOP_AFTER_EPOCH", "2")
    cbs = ft.callbacks(tmp_path / "backup")
    assert type(cbs[-1]) is ft.StopAfterEpoch and cbs[-1].epoch == 2
    monkeypatch.setenv("TENSORFLEET_STOP_AFTER_EPOCH", "two")
    with pytest.raises(ValueError,
                       match=r"^TENSORFLEET_STOP_AFTER_EPOCH must be a positive integer\. Received: 'two'$"):
        ft.callbacks(tmp_path / "backup")
    with pytest.raises(ValueError, match=r"^epoch must be a positive integer\. Received: epoch=0$"):
        ft.StopAfterEpoch(0)


@pytest.mark.parametrize("save_freq", [0, -3, "step", 1.5, True])
def test_bad_save_freq_is_a_clear_error(tmp_path: Path, save_freq: object) -> None:
    with pytest.raises(ValueError) as info:
        ft.callbacks(tmp_path, save_freq=save_freq)  # type: ignore[arg-type]
    assert str(info.value) == ("save_freq must be 'epoch' or a positive number of steps. Received: "
                               f"save_freq={save_freq!r}")


def test_best_model_checkpoint_checks_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^filepath must end in '\.keras'\. Received: filepath='.*best\.h5'$"):
        ft.BestModelCheckpoint(tmp_path / "best.h5")
    with pytest.raises(ValueError, match=r"^mode must be 'min' or 'max'\. Received: mode='up'$"):
        ft.BestModelCheckpoint(tmp_path / "best.keras", mode="up")


def test_resumed_epoch_reads_the_log() -> None:
    assert ft.resumed_epoch(["x", "tensorfleet: resumed from backup at epoch 4"]) == 4
    assert ft.resumed_epoch(["tensorfleet: epoch 1/6 begin"]) is None


# ---------------------------------------------------------------- best model, in process


def _tiny_fit(tmp_path: Path, callbacks: list, epochs: int = 4):

    from tensorfleet.models import build
    from tensorfleet.models.datasets import load_digits

    split = load_digits(flat=True)
    tf_keras.utils.set_random_seed(0)
    model = build("digits_mlp", hidden=16, keras="tf_keras")
    model.compile(optimizer=tf_keras.optimizers.Adam(0.01),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(split.x_train[:256], split.y_train[:256], batch_size=64, epochs=epochs,
                        validation_data=(split.x_test, split.y_test), callbacks=callbacks, verbose=0)
    return model, history, split


def test_best_model_is_the_best_epochs_and_written_atomically(tmp_path: Path, capsys) -> None:

    target = tmp_path / "out" / "best.keras"
    best = _k2("BestModelCheckpoint")(target, monitor="val_accuracy", mode="max")
    _, history, split = _tiny_fit(tmp_path, [best, _k2("EpochLog")()])
    accuracies = history.history["val_accuracy"]
    best_epoch = int(np.argmax(accuracies)) + 1
    record = json.loads((tmp_path / "out" / "best.keras.json").read_text())
    assert record == {"epoch": best_epoch, "monitor": "val_accuracy", "value": pytest.approx(max(accuracies))}
    loaded = tf_keras.models.load_model(target)
    _, accuracy = loaded.evaluate(split.x_test, split.y_test, verbose=0)
    assert accuracy == pytest.approx(max(accuracies), abs=1e-6)
    assert sorted(p.name for p in target.parent.iterdir()) == ["best.keras", "best.keras.json"]  # no temp files
    out = capsys.readouterr().out
    assert "tensorfleet: epoch 1/4 begin" in out and "tensorfleet: epoch 4/4 end accuracy=" in out


def test_best_model_survives_a_restart_with_a_worse_run(tmp_path: Path) -> None:
    target = tmp_path / "best.keras"
    write_json(tmp_path / "best.keras.json", {"epoch": 9, "monitor": "val_accuracy", "value": 1.5})
    target.write_bytes(b"the better model")
    _tiny_fit(tmp_path, [_k2("BestModelCheckpoint")(target, monitor="val_accuracy", mode="max")], epochs=2)
    assert target.read_bytes() == b"the better model"


def test_monitoring_a_metric_fit_does_not_log_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match=r"BestModelCheckpoint monitors 'val_auc', which fit did not log\. Logged: "
                                       r"\['accuracy', 'loss', 'val_accuracy', 'val_loss'\]"):
        _tiny_fit(tmp_path, [_k2("BestModelCheckpoint")(tmp_path / "b.keras", monitor="val_auc")], epochs=1)


# ---------------------------------------------------------------- real processes, killed


def _weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_worker_frozen_in_epoch_3_is_found_by_the_collective_timeout_and_resumes_to_the_uninterrupted_weights(
        tmp_path: Path) -> None:
    import signal

    script = EXAMPLES / "train_digits_multiworker.py"
    # 15 s, not less: on a loaded 2-core machine (load average 8 seen) a healthy collective waited
    # out 8 s and the spurious timeout used up the job's last restart.
    common = ["--model", "digits_cnn", "--epochs", "4", "--examples-per-epoch", "256", "--collective-timeout", "15"]
    clean = launch(script, [*common, "--weights-out", str(tmp_path / "clean.npz")], workers=2,
                   recovery=Recovery(backup_dir=tmp_path / "clean-backup"), timeouts=Timeouts(timeout=150),
                   output=QUIET)
    assert clean.restarts == 0
    # Worker 1 frozen (SIGSTOP) during epoch 3: no process exits, so only the collective/heartbeat
    # timeout in worker 0 ends the hang, and the launcher restarts the job. (A killed worker's restart
    # is examples/launch_fault_tolerant.py's, run by tests/test_example_scripts.py, and test_launcher's.)
    with testing.faults(Fault("worker:1", r"^tensorfleet: epoch 3 step 2$", signal=signal.SIGSTOP)):
        faulty = launch(script, [*common, "--log-steps", "--weights-out", str(tmp_path / "faulty.npz")], workers=2,
                        recovery=Recovery(max_restarts=1, backoff=0.5, backup_dir=tmp_path / "faulty-backup"),
                        timeouts=Timeouts(timeout=150), output=QUIET)
    assert faulty.returncode == 0 and faulty.restarts == 1
    restarts = [e for e in faulty.events if "restarting all 2 tasks" in e.text]
    assert restarts[0].text.startswith("worker:0 exited with status 1; restarting all 2 tasks (restart 1/1)")
    frozen = next(e.time for e in faulty.events if e.text.startswith("injecting fault: SIGSTOP to worker:1"))
    assert restarts[0].time - frozen < 60
    first = "\n".join(faulty.output("worker:0", attempt=0))
    assert "heartbeat timeout" in first or "Collective ops is aborted" in first

    def begun(lines: list[str]) -> list[int]:
        return [int(m.group(1)) for line in lines if (m := re.match(r"tensorfleet: epoch (\d)/4 begin", line))]

    for task in ("worker:0", "worker:1"):
        assert ft.resumed_epoch(faulty.output(task, attempt=0)) is None
        assert begun(faulty.output(task, attempt=0)) == [1, 2, 3]
        assert ft.resumed_epoch(faulty.output(task, attempt=1)) == 3
        assert begun(faulty.output(task, attempt=1)) == [3, 4]
    clean_w, faulty_w = _weights(tmp_path / "clean.npz"), _weights(tmp_path / "faulty.npz")
    assert [w.shape for w in clean_w] == [w.shape for w in faulty_w]
    difference = max(float(np.abs(a - b).max()) for a, b in zip(clean_w, faulty_w))
    print(f"largest weight difference to the uninterrupted run: {difference}")
    assert difference <= 1e-5, f"resumed weights differ from the uninterrupted run's by {difference}"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_parameter_server_worker_killed_is_restarted_alone_and_training_completes(tmp_path: Path) -> None:
    epochs, steps = 4, 50
    with testing.faults(Fault("worker:1", r"^tensorfleet: epoch 2/4 begin$", watch="chief:0")):
        result = launch(EXAMPLES / "train_digits_ps.py", ["--epochs", str(epochs), "--steps-per-epoch", str(steps)],
                        workers=2, ps=1, timeouts=Timeouts(timeout=180), output=QUIET,
                        recovery=Recovery(max_restarts=2, backoff=0.5))
    assert result.returncode == 0 and result.restarts == 1
    assert [e.text for e in result.events if "restart" in e.text] == [
        "worker:1 was killed by SIGKILL; restarting worker:1 only (restart 1/2) in 0.5s",
        "restarted worker:1 (attempt 1)",
    ]
    # Only worker 1 ran twice; the chief, the ps and worker 0 ran once, without interruption.
    assert {line.task for line in result.lines if line.attempt == 1} == {"worker:1"}
    chief = result.output("chief:0")
    assert [line.split(" end")[0] for line in chief if " end " in line] == [
        f"tensorfleet: epoch {e}/{epochs}" for e in range(1, epochs + 1)]
    done = next(line for line in chief if line.startswith("tensorfleet: done"))
    iterations = int(re.search(r"iterations=(\d+)", done).group(1))
    # The coordinator runs each step at least once: a step in flight on the killed worker
    # may have updated the ps before the kill and is run again, so at most one extra.
    assert epochs * steps <= iterations <= epochs * steps + 1
    assert float(re.search(r"test_accuracy=([\d.]+)", done).group(1)) > 0.9



# ---------------------------------------------------------------- cleaning up after a successful run


def _fit_with(cbs: list) -> None:

    model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(2,))])
    model.compile("sgd", "mse")
    model.fit(np.zeros((8, 2)), np.zeros((8, 1)), epochs=2, verbose=0, callbacks=cbs)


def test_a_successful_run_leaves_no_default_backup_directory(tmp_path: Path, monkeypatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("TENSORFLEET_BACKUP_DIR", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    cbs = ft.callbacks(log=False, keras="keras2")
    assert [type(c).__name__ for c in cbs] == ["BackupAndRestore", "BackupCleanup"]
    assert Path(cbs[0].backup_dir).parent == tmp_path / "tensorfleet-backup"
    _fit_with(cbs)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cleanup_keeps_what_is_not_empty_and_what_the_user_named(tmp_path: Path, monkeypatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TENSORFLEET_BACKUP_DIR", raising=False)
    (tmp_path / "tensorfleet-backup").mkdir()
    (tmp_path / "tensorfleet-backup" / "other-job").mkdir()  # another job's backup stays
    _fit_with(ft.callbacks(log=False, keras="keras2"))
    assert [p.name for p in (tmp_path / "tensorfleet-backup").iterdir()] == ["other-job"]
    # A directory the user named (argument or environment) is theirs: it stays, even empty.
    cbs = ft.callbacks(tmp_path / "mine", log=False, keras="keras2")
    assert [type(c).__name__ for c in cbs] == ["BackupAndRestore"]
    _fit_with(cbs)
    monkeypatch.setenv("TENSORFLEET_BACKUP_DIR", str(tmp_path / "from-env"))
    _fit_with(ft.callbacks(log=False, keras="keras2"))
    assert (tmp_path / "mine").is_dir() and (tmp_path / "from-env").is_dir()
