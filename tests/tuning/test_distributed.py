"""Real distributed searches: Keras Tuner's chief oracle and tuner workers as processes on 127.0.0.1,
a tiny MLP on scikit-learn's digits, with a worker and a chief killed mid-search."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from tensorfleet import testing
from tensorfleet.cli.main import main
from tensorfleet.compat.keras import keras2
from tensorfleet.testing import Fault
from tensorfleet.tuning.distributed import Supervision, TrialOptions, TuningError, search

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

SCRIPT = str(Path(__file__).with_name("digits_search.py"))
FAST = {"epochs": 1, "trial": TrialOptions(batch_size=64), "supervision": Supervision(timeout=150),
        "log": lambda line: None}


def _oracle_trials(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((out / "oracle").glob("trial_*/trial.json"))}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_mid_trial_runs_the_trial_again_and_the_search_completes(tmp_path, digits_flat):
    from tensorfleet.compat.keras import load_model

    lines: list[str] = []
    with testing.faults(Fault(task="tuner:1", when=r"^epoch 2/2 begins")):
        result = search(SCRIPT, out_dir=tmp_path, workers=2, max_trials=4, epochs=2, log=lines.append,
                        supervision=Supervision(timeout=200))
    # The oracle recorded every trial, each completed once with a score; the killed one ran twice.
    trials = _oracle_trials(tmp_path)
    assert sorted(trials) == ["trial_0", "trial_1", "trial_2", "trial_3"]
    assert [t["status"] for t in trials.values()] == ["COMPLETED"] * 4
    assert len({json.dumps(t["hyperparameters"]["values"], sort_keys=True) for t in trials.values()}) == 4
    assert result.restarts == 1
    assert sorted(r.runs for r in result.trials) == [1, 1, 1, 2]
    assert [r.score for r in result.trials] == [t["score"] for t in trials.values()]
    assert any("runs again (its worker was restarted)" in line for line in lines)
    # The best is the highest score, and the exported model scores exactly that on the validation data.
    assert result.best.score == max(t["score"] for t in trials.values())
    model = load_model(result.best_model)  # the search's processes are a user's: Keras 3 wrote it
    _, accuracy = model.evaluate(digits_flat.x_test, digits_flat.y_test, batch_size=32, verbose=0)
    assert accuracy == pytest.approx(result.best.score, abs=1e-7)
    assert model.layers[0].units == result.best.hyperparameters["units"]
    table = (tmp_path / "results.txt").read_text().splitlines()
    assert table[0].split() == ["trial", "units", "learning_rate", "val_accuracy", "time", "(s)", "status"]
    assert len(table) == 5
    for name in ("objective.png", "hyperparameters.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_chief_resumes_a_bayesian_search_from_the_oracles_saved_state(tmp_path, capsys):
    # The chief is killed once the first trial has ended; at least one trial (the third, on the worker
    # that asks next) is then still to run. The time bounds are wide: on a loaded 2-core machine each of
    # the six processes takes tens of seconds to start. Every line is kept, for the message of a failure.
    kill_chief = Fault(task="chief:0", when=r"trial \d+ completed", signal=signal.SIGKILL)
    lines: list[str] = []
    try:
        with testing.faults(kill_chief):
            search(SCRIPT, out_dir=tmp_path, workers=2, max_trials=3, algorithm="bayesian",
                   **{**FAST, "supervision": Supervision(timeout=280), "log": lines.append, "verbose": True})
    except TuningError as exc:
        error = str(exc)
    else:
        pytest.fail("The search ended before its chief was killed:\n" + "\n".join(lines))
    assert re.match(r"The chief oracle exited with status -9\..*the same search run again continues it", error), \
        error + "\n" + "\n".join(lines)
    before = _oracle_trials(tmp_path)
    done = {k: t for k, t in before.items() if t["status"] == "COMPLETED"}
    assert 1 <= len(done) < 3, "\n".join(lines)
    capsys.readouterr()
    # The resume goes through the command line, which prints the progress and the table.
    assert main(["tune", SCRIPT, "--out", str(tmp_path), "--workers", "2", "--max-trials", "3", "--epochs", "1",
                 "--batch-size", "64", "--algorithm", "bayesian", "--resume"]) == 0
    printed = capsys.readouterr().out
    after = _oracle_trials(tmp_path)
    assert sorted(after) == ["trial_0", "trial_1", "trial_2"]
    assert [t["status"] for t in after.values()] == ["COMPLETED"] * 3
    for key, trial in done.items():  # what finished before the kill is kept, not run again
        assert after[key]["score"] == trial["score"]
        assert after[key]["hyperparameters"] == trial["hyperparameters"]
    runs = json.loads((tmp_path / "times.json").read_text())
    assert [runs[key.removeprefix("trial_")]["runs"] for key in done] == [1] * len(done)
    assert "trial  units  learning_rate  val_accuracy  time (s)  status" in printed
    assert "3 of 3 trials completed" in printed
    assert " began on tuner" in printed or "runs again" in printed


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_objective_the_model_does_not_report_ends_the_search_naming_what_it_reports(tmp_path):
    with pytest.raises(ValueError, match=r"The model does not report the objective 'val_auc'; it reports: "
                                         r"accuracy, loss, val_accuracy, val_loss\. Choose one of these"):
        search(SCRIPT, out_dir=tmp_path, workers=1, max_trials=2,
               **{**FAST, "trial": TrialOptions(objective="val_auc", direction="max", batch_size=64)})


KERAS3_SCRIPT = """\
import keras

from tensorfleet.models.datasets import load_digits


def build_model(hp):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(hp.Choice("units", [8, 32]), activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(hp.Choice("learning_rate", [1e-3, 1e-2])),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def data():
    split = load_digits(flat=True)
    return split.x_train, split.y_train, split.x_test, split.y_test
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_keras_3_search_runs_on_two_workers_in_a_users_process(tmp_path, keras3, digits_flat, monkeypatch):
    from tensorfleet.compat.keras import load_model

    # the searches' processes are a user's: Keras Tuner drives Keras 3
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    script = tmp_path / "keras3_search.py"
    script.write_text(KERAS3_SCRIPT)
    lines: list[str] = []
    result = search(script, out_dir=tmp_path / "out", workers=2, max_trials=3, **{**FAST, "log": lines.append})
    assert lines[0].endswith(", models in Keras 3")
    assert result.completed == 3, lines
    for i in (0, 1):
        assert f"[tuner:{i}] tuner{i} trains each trial under one_device over 1 replica(s)" in lines
    trials = _oracle_trials(tmp_path / "out")
    assert [t["status"] for t in trials.values()] == ["COMPLETED"] * 3
    assert result.best.score == max(t["score"] for t in trials.values())
    model = load_model(result.best_model)  # written by Keras 3, read by Keras 3
    assert isinstance(model, keras3.Model)
    _, accuracy = model.evaluate(digits_flat.x_test, digits_flat.y_test, batch_size=32, verbose=0)
    assert accuracy == pytest.approx(result.best.score, abs=1e-7)
    assert model.layers[0].units == result.best.hyperparameters["units"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_keras_3_script_in_a_tf_keras_search_is_refused_with_one_error_naming_the_fix(tmp_path, keras3, capsys,
                                                                                         monkeypatch):
    from tensorfleet.tuning.task import TunerKerasError

    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")  # a user who chose tf_keras: so do the search's processes
    script = tmp_path / "keras3_search.py"
    script.write_text(KERAS3_SCRIPT.replace("def data():", "def data():\n    raise AssertionError('no data')\n"))
    expected = ("error: build_model of keras3_search.py returned a Keras 3 model "
                "(keras.src.models.sequential.Sequential), but Keras Tuner drives tf_keras (Keras 2) in this search, "
                "because TF_USE_LEGACY_KERAS=1 is set in its environment. Start the search without TF_USE_LEGACY_KERAS "
                "(Keras Tuner then drives Keras 3, its own choice), or build the model with tf_keras (`import tf_keras "
                "as keras`).")
    with pytest.raises(TunerKerasError) as raised:
        search(script, out_dir=tmp_path / "out", workers=1, max_trials=2, **FAST)
    assert f"error: {raised.value}" == expected
    assert main(["tune", str(script), "--out", str(tmp_path / "cli"), "--workers", "1", "--max-trials", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [expected]


def test_the_command_refuses_an_unknown_algorithm_in_one_line(tmp_path, capsys):
    assert main(["tune", SCRIPT, "--out", str(tmp_path), "--algorithm", "grid"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: algorithm must be one of 'random', 'bayesian', 'hyperband'. Received: algorithm='grid'"]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_hyperband_promotes_a_trial_and_trials_train_under_mirrored_over_two_devices(tmp_path):
    lines: list[str] = []
    # One worker, so that Hyperband's order is fixed (with two, a fourth trial asked for while the
    # third still runs opens the next bracket instead of waiting).
    result = search(SCRIPT, out_dir=tmp_path, workers=1, max_trials=4, algorithm="hyperband", epochs=3,
                    trial=TrialOptions(strategy="mirrored", devices_per_trial=2, batch_size=64),
                    supervision=Supervision(timeout=180), log=lines.append)
    assert "[tuner:0] tuner0 trains each trial under mirrored over 2 replica(s)" in lines
    assert result.completed == 4
    # Hyperband (max_epochs 3, factor 3): three trials of 1 epoch, then the best of them trained on
    # from its checkpoint at epoch 1 to epoch 3.
    hps = [r.hyperparameters for r in result.trials]
    assert [(h["tuner/epochs"], h["tuner/initial_epoch"]) for h in hps] == [(1, 0), (1, 0), (1, 0), (3, 1)]
    first_round = {r.trial_id: r.score for r in result.trials[:3]}
    assert hps[3]["tuner/trial_id"] == max(first_round, key=first_round.get)
