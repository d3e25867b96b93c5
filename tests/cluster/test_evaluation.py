"""The side-car evaluator: each checkpoint's metrics are model.evaluate's on that checkpoint, and a
killed evaluator, started again, skips what it already evaluated."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tensorfleet.cluster.evaluation import (
    BEST_MODEL,
    checkpoint_callback,
    evaluated_checkpoints,
    evaluation,
    export_model,
)
from tensorfleet.compat.keras import keras2
from tests.cluster.evaluation_job import build_model, held_out
from tests.conftest import reap

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "cluster" / "evaluation_job.py"


def _start(checkpoints: Path, out: Path, last: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.cluster.evaluation_job", str(checkpoints), str(out),
                             str(last)], cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_rows(out: Path, count: int, process: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while len(evaluated_checkpoints(out)) < count:
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, "the evaluator recorded no evaluation in time"
        time.sleep(0.2)


def test_a_training_task_returns_false_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}')
    assert evaluation(build_model, None, checkpoint_dir=tmp_path, out_dir=tmp_path / "eval") is False
    assert not (tmp_path / "eval").exists()


def test_out_is_the_older_name_of_out_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}')
    with pytest.warns(DeprecationWarning, match=r"^evaluation: 'out' is now 'out_dir'; the older name will stop"):
        assert evaluation(build_model, None, checkpoint_dir=tmp_path, out=tmp_path / "eval") is False
    with pytest.warns(DeprecationWarning, match=r"^evaluated_checkpoints: 'out' is now 'out_dir'"):
        assert evaluated_checkpoints(out=tmp_path) == []
    with pytest.raises(ValueError, match=r"\bout\b.*\bout_dir\b"):
        evaluation(build_model, None, checkpoint_dir=tmp_path, out=tmp_path, out_dir=tmp_path)


@pytest.mark.timeout(120)
def test_a_model_restored_from_weights_exports_with_its_optimizer_state_and_loads_quietly(tmp_path, caplog):
    import numpy as np

    x, y = np.random.RandomState(0).rand(64, 64).astype("float32"), np.arange(64) % 10
    trained = build_model()
    trained.fit(x, y, epochs=1, verbose=0)
    trained.save_weights(str(tmp_path / "ckpt-1"))
    restored = build_model()  # as the evaluator and the tuning chief have it: weights, optimizer never stepped
    restored.load_weights(str(tmp_path / "ckpt-1")).expect_partial()
    export_model(restored, tmp_path / "best.keras")
    with caplog.at_level(logging.WARNING):
        loaded = tf_keras.models.load_model(tmp_path / "best.keras")
    assert not [r for r in caplog.records if "Skipping variable loading" in r.getMessage()]
    assert len(loaded.optimizer.variables) == len(trained.optimizer.variables) == 9  # Adam: step, 2 x 4 slots
    for ours, theirs in zip(loaded.optimizer.variables, trained.optimizer.variables):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # nothing else left behind
        "best.keras", "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]


def test_a_checkpoint_is_recorded_only_once_its_best_model_is_saved(tmp_path, monkeypatch):
    from tensorfleet.cluster import evaluation as module
    from tensorfleet.cluster.evaluation import _Recorder

    model = build_model()
    recorder = _Recorder(model, tmp_path / "ckpt", tmp_path, "accuracy", "max", log=lambda line: None)
    recorder.current = 1

    def killed(*args, **kwargs):  # the evaluator dies while saving the best model
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "export_model", killed)
    with pytest.raises(KeyboardInterrupt):
        recorder.record({"loss": 1.5, "accuracy": 0.5})
    assert evaluated_checkpoints(tmp_path) == [] and not (tmp_path / BEST_MODEL).exists()
    # started again, it evaluates checkpoint 1 again: saved, then recorded
    monkeypatch.setattr(module, "export_model", export_model)
    again = _Recorder(model, tmp_path / "ckpt", tmp_path, "accuracy", "max", log=lambda line: None)
    again.current = 1
    again.record({"loss": 1.5, "accuracy": 0.5})
    assert [r["checkpoint"] for r in evaluated_checkpoints(tmp_path)] == [1] and (tmp_path / BEST_MODEL).is_file()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_evaluator_matches_model_evaluate_per_checkpoint_and_skips_what_it_did_after_a_kill(tmp_path, digits_flat):

    checkpoints, out = tmp_path / "ckpt", tmp_path / "eval"
    x, y = digits_flat.x_train, digits_flat.y_train
    model = build_model()
    model.fit(x, y, epochs=2, batch_size=64, verbose=0, callbacks=[checkpoint_callback(checkpoints, keras=model)])
    evaluator = _start(checkpoints, out, last=3)
    try:
        _wait_for_rows(out, 1, evaluator)  # the newest checkpoint, ckpt-2, is evaluated first
        evaluator.kill()
        evaluator.wait()
        again = _start(checkpoints, out, last=3)
        seen = []  # the restarted evaluator restores the newest checkpoint first: ckpt-2 again
        while not seen or "skipped" not in seen[-1]:
            seen.append(again.stdout.readline())
            assert seen[-1], "".join(seen)
        model.fit(x, y, initial_epoch=2, epochs=3, batch_size=64, verbose=0,
                  callbacks=[checkpoint_callback(checkpoints, keras=model)])
        output = "".join(seen) + again.communicate(timeout=120)[0]
    finally:
        reap(evaluator)
        reap(again)
    assert again.returncode == 0, output
    assert "evaluator: checkpoint 2 was evaluated before this evaluator restarted; skipped" in output
    rows = evaluated_checkpoints(out)
    steps_per_epoch = -(-len(x) // 64)
    assert [(r["checkpoint"], r["step"]) for r in rows] == [(2, 2 * steps_per_epoch), (3, 3 * steps_per_epoch)]
    for row in rows:
        fresh = build_model()
        fresh.load_weights(str(checkpoints / f"ckpt-{row['checkpoint']}")).expect_partial()
        loss, accuracy = fresh.evaluate(digits_flat.x_test, digits_flat.y_test, batch_size=32, verbose=0)
        assert row["accuracy"] == pytest.approx(accuracy, abs=1e-7)
        assert row["loss"] == pytest.approx(loss, rel=1e-6)
    best = max(rows, key=lambda r: r["accuracy"])
    _, best_accuracy = tf_keras.models.load_model(out / BEST_MODEL).evaluate(
        digits_flat.x_test, digits_flat.y_test, batch_size=32, verbose=0)
    assert best_accuracy == pytest.approx(best["accuracy"], abs=1e-7)
    assert list((out / "tensorboard").rglob("events.out.tfevents.*"))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_under_the_launcher_the_same_script_trains_in_the_worker_and_evaluates_in_the_evaluator(tmp_path):
    from tensorfleet.cluster.launcher import TaskCommand, TaskOutput, Timeouts, launch

    checkpoints, out = tmp_path / "ckpt", tmp_path / "eval"
    result = launch(JOB, ["--launched", str(checkpoints), str(out), "3"], workers=1, evaluator=True,
                    timeouts=Timeouts(timeout=150), output=TaskOutput(log=None),
                    command=TaskCommand(env={"PYTHONPATH": str(ROOT)}))
    assert result.returncode == 0, "\n".join(result.output())
    rows = evaluated_checkpoints(out)
    assert rows[-1]["checkpoint"] == 3  # the last checkpoint is evaluated before the evaluator stops
    assert [r["checkpoint"] for r in rows] == sorted({r["checkpoint"] for r in rows})
    assert any(line.startswith("evaluator: checkpoint 3 (step 69)") for line in result.output("evaluator:0"))
    assert not any("evaluator:" in line for line in result.output("worker:0"))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_an_evaluator_busy_when_training_ends_still_evaluates_the_last_checkpoint(tmp_path, digits_flat):
    from tensorfleet.cluster.launcher import TaskCommand, TaskOutput, Timeouts, launch

    # No last checkpoint is named: the evaluator learns from the launcher that training has ended. The
    # trainer pauses between epochs so that earlier checkpoints are evaluated while it trains, and exits
    # the moment its last checkpoint is written; evaluating one takes seconds (the test set 100 times
    # over). The old 5 s grace (here 0.5 s) stopped the evaluator before it had evaluated the last.
    checkpoints, out = tmp_path / "ckpt", tmp_path / "eval"
    result = launch(JOB, ["--launched", str(checkpoints), str(out), "3", "--until-training-ends", "--repeat", "100",
                          "--pause", "2", "--hard-exit"], workers=1, evaluator=True,
                    timeouts=Timeouts(timeout=150, grace=0.5, evaluator_timeout=120), output=TaskOutput(log=None),
                    command=TaskCommand(env={"PYTHONPATH": str(ROOT)}))
    assert result.returncode == 0, "\n".join(result.output())
    events = [line.text for line in result.events]
    assert "training ended; waiting up to 120s (evaluator_timeout) for evaluator:0 to evaluate the last checkpoint" \
        in events, events
    assert not any("did not finish" in e or "after training ended" in e for e in events), events
    assert [s.status for s in result.spans if s.task == "evaluator:0"] == [0]
    assert "evaluator: training ended and its last checkpoint, 3, is evaluated; the evaluator stops" \
        in result.output("evaluator:0")
    rows = evaluated_checkpoints(out)
    assert rows[-1]["checkpoint"] == 3 and rows[-1]["step"] == 3 * 23
    assert [r["checkpoint"] for r in rows] == sorted({r["checkpoint"] for r in rows})
    x, y = held_out(100)
    fresh = build_model()
    fresh.load_weights(str(checkpoints / "ckpt-3")).expect_partial()
    loss, accuracy = fresh.evaluate(x, y, batch_size=32, verbose=0)
    assert rows[-1]["accuracy"] == pytest.approx(accuracy, abs=1e-7)
    assert rows[-1]["loss"] == pytest.approx(loss, rel=1e-6)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_an_evaluator_that_does_not_end_is_stopped_after_evaluator_timeout(tmp_path):
    from tensorfleet.cluster.launcher import TaskOutput, Timeouts, launch

    script = tmp_path / "never_done.py"
    script.write_text("import json, os, time\n"
                      "if json.loads(os.environ['TF_CONFIG'])['task']['type'] == 'evaluator':\n"
                      "    print('evaluating forever', flush=True)\n"
                      "    time.sleep(600)\n")
    result = launch(script, workers=1, evaluator=True, timeouts=Timeouts(timeout=50, grace=1.0, evaluator_timeout=1.0),
                    output=TaskOutput(log=None))
    assert result.returncode == 0
    events = [line.text for line in result.events]
    assert events[-2:] == [
        "training ended; waiting up to 1s (evaluator_timeout) for evaluator:0 to evaluate the last checkpoint",
        "evaluator:0 did not finish within evaluator_timeout=1s; stopping it (its last checkpoint may be unevaluated)"]
    assert [s.status for s in result.spans if s.task == "evaluator:0"] == [-15]


def test_evaluator_timeout_must_not_be_negative(tmp_path):
    from tensorfleet.cluster.launcher import Timeouts, launch

    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(ValueError,
                       match=r"^evaluator_timeout must be a finite number >= 0\. Received: evaluator_timeout=-1$"):
        launch(script, workers=1, evaluator=True, timeouts=Timeouts(evaluator_timeout=-1))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_example_evaluates_every_checkpoint_up_to_where_early_stopping_ended_training(tmp_path, digits_flat):
    from examples.evaluate_while_training import build_model as example_model
    from tensorfleet.cluster.launcher import TaskCommand, TaskOutput, Timeouts, launch

    result = launch(ROOT / "examples" / "evaluate_while_training.py", ["--out", str(tmp_path), "--epochs", "8"],
                    workers=2, evaluator=True, timeouts=Timeouts(timeout=240), output=TaskOutput(log=None),
                    command=TaskCommand(env={"PYTHONPATH": str(ROOT)}))
    assert result.returncode == 0, "\n".join(result.output())
    assert [s.status for s in result.spans if s.task == "evaluator:0"] == [0]
    epochs = sum(line.startswith("Epoch ") for line in result.output("worker:0"))
    rows = evaluated_checkpoints(tmp_path / "eval")
    assert rows[-1]["checkpoint"] == epochs  # the last epoch trained, wherever early stopping ended it
    assert f"training ended and its last checkpoint, {epochs}, is evaluated; the evaluator stops" \
        in result.output("evaluator:0")
    import tensorflow as tf

    fresh = example_model()  # Keras 3 (the example writes import keras), checkpointed by TensorFlow's Checkpoint
    tf.train.Checkpoint(model=fresh).restore(str(tmp_path / "ckpt" / f"ckpt-{epochs}")).expect_partial()
    # Worker 1 saved into a scratch folder of its own, removed when it ended: only the chief's are here.
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if not p.name.startswith("ckpt-")) == ["checkpoint"]
    loss, accuracy = fresh.evaluate(digits_flat.x_test, digits_flat.y_test, batch_size=32, verbose=0)
    assert rows[-1]["accuracy"] == pytest.approx(accuracy, abs=1e-7)
    assert rows[-1]["loss"] == pytest.approx(loss, rel=1e-6)
