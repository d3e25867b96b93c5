"""The search's results: best-so-far, the table, and the files written (no processes)."""

from __future__ import annotations

import json

from tensorfleet.tuning.results import TrialRecord, best_record, best_so_far, format_table, read_results, write_results

RECORDS = [
    TrialRecord("0", "COMPLETED", {"units": 8, "optimizer": "adam"}, 0.80, 1, 2.0),
    TrialRecord("1", "FAILED", {"units": 32, "optimizer": "sgd"}, None, None, 0.5, 2, "ValueError: boom"),
    TrialRecord("2", "COMPLETED", {"units": 32, "optimizer": "sgd"}, 0.95, 0, 3.25),
    TrialRecord("3", "COMPLETED", {"units": 16, "optimizer": "adam", "tuner/epochs": 2}, 0.90, 1, 1.0),
]


def test_best_so_far_skips_trials_without_a_score_and_follows_the_direction():
    assert best_so_far([0.8, None, 0.95, 0.9], "max") == [0.8, 0.8, 0.95, 0.95]
    assert best_so_far([None, 0.5, 0.7, 0.2], "min") == [None, 0.5, 0.5, 0.2]


def test_the_best_record_is_the_best_completed_trial():
    assert best_record(RECORDS, "max").trial_id == "2"
    assert best_record(RECORDS, "min").trial_id == "0"
    assert best_record(RECORDS[1:2], "max") is None


def test_the_table_has_a_column_per_hyperparameter_and_leaves_out_keras_tuners_own():
    assert format_table(RECORDS, objective="val_accuracy").splitlines() == [
        "trial  units  optimizer  val_accuracy  time (s)  status",
        "0      8      adam       0.8000        2.0       COMPLETED",
        "1      32     sgd        -             0.5       FAILED",
        "2      32     sgd        0.9500        3.2       COMPLETED",
        "3      16     adam       0.9000        1.0       COMPLETED",
    ]


def test_write_results_writes_the_table_json_and_both_plots(tmp_path):
    summary = write_results(tmp_path, RECORDS, objective="val_accuracy", direction="max", best_model="best.keras")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hyperparameters.png", "objective.png", "results.json", "results.txt"]
    assert summary["best"] == {"trial_id": "2", "score": 0.95, "hyperparameters": {"units": 32, "optimizer": "sgd"},
                               "model": "best.keras"}
    assert json.loads((tmp_path / "results.json").read_text()) == summary
    assert (tmp_path / "objective.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again, records = read_results(tmp_path)
    assert records == RECORDS


def test_a_keras_tuner_trial_becomes_a_record_with_its_time_and_the_space_order():
    from tensorfleet.compat.keras_tuner import import_keras_tuner

    kt = import_keras_tuner()
    Trial = kt.engine.trial.Trial

    hp = kt.HyperParameters()
    hp.Int("units", 8, 32, step=8)
    hp.Choice("optimizer", ["adam", "sgd"])
    trial = Trial(hp.copy(), trial_id="3", status="FAILED")
    trial.hyperparameters.values = {"optimizer": "sgd", "units": 16}
    trial.message = "Traceback (most recent call last):\n  ...\nValueError: boom\n"
    record = TrialRecord.from_trial(trial, {"start": 100.0, "end": 102.5, "runs": 2, "tuner": "tuner1"},
                                    order=["units", "optimizer"])
    assert record == TrialRecord("3", "FAILED", {"units": 16, "optimizer": "sgd"}, None, 0, 2.5, 2,
                                 "ValueError: boom", "tuner1")
    assert list(record.hyperparameters) == ["units", "optimizer"]
