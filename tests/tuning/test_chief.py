"""The chief's repairs of Keras Tuner's saved state (real oracles, no processes)."""

from __future__ import annotations

import json


def _oracle(tmp_path):
    from tensorfleet.compat.keras_tuner import import_keras_tuner, set_project_dir

    kt = import_keras_tuner()  # first: a Keras Tuner imported before tensorfleet's would drive Keras 3
    oracle = kt.oracles.RandomSearchOracle(objective=kt.Objective("val_accuracy", "max"), max_trials=5, seed=0)
    set_project_dir(oracle, str(tmp_path), "oracle")
    return oracle


def test_a_reloaded_queue_drops_trials_that_ended_and_takes_running_ones_it_lacks(tmp_path):
    from tensorfleet.compat.keras_tuner import import_keras_tuner, retry_queue, set_retry_queue
    from tensorfleet.tuning.chief import repair_reloaded

    oracle = _oracle(tmp_path)
    Trial = import_keras_tuner().engine.trial.Trial
    for tid, status in (("0", "COMPLETED"), ("1", "RUNNING"), ("2", "INVALID"), ("3", "RUNNING"), ("4", "FAILED")):
        oracle.trials[tid] = Trial(oracle.get_space(), trial_id=tid, status=status)
    set_retry_queue(oracle, ["0", "2", "3", "4"])  # 0 and 4 ended after the state was saved; 1 was left out
    repair_reloaded(oracle)
    assert retry_queue(oracle) == ["2", "3", "1"]


def test_saved_state_and_trial_files_are_whole_json(tmp_path):
    from tensorfleet.tuning.chief import atomic_saves

    oracle = _oracle(tmp_path)
    hp = oracle.get_space()
    hp.Choice("units", [8, 32])
    oracle.update_space(hp)
    atomic_saves(oracle)
    trial = oracle.create_trial("tuner0")
    oracle.update_trial(trial.trial_id, {"val_accuracy": 0.5})
    trial.status = "COMPLETED"
    oracle.end_trial(trial)
    state = json.loads((tmp_path / "oracle" / "oracle.json").read_text())
    saved = json.loads((tmp_path / "oracle" / "trial_0" / "trial.json").read_text())
    assert (state["end_order"], saved["status"], saved["score"]) == (["0"], "COMPLETED", 0.5)
    assert not list((tmp_path / "oracle").rglob("*.tmp"))


def test_each_process_writes_its_own_tuner_state_by_renaming_a_whole_file(tmp_path, monkeypatch):
    # Keras Tuner rewrites OUT/oracle/<tuner id>.json in place, so a process killed mid-write would
    # leave half a file for --resume to fail on; a new inode each time shows it is renamed into place.
    from tensorfleet.tuning.config import SearchConfig
    from tensorfleet.tuning.task import load_script, make_tuner
    from tests.tuning.test_distributed import SCRIPT

    monkeypatch.delenv("KERASTUNER_TUNER_ID", raising=False)
    monkeypatch.delenv("KERASTUNER_ORACLE_IP", raising=False)
    config = SearchConfig(script=SCRIPT, out_dir=str(tmp_path), workers=1, max_trials=2)
    tuner = make_tuner(config, load_script(SCRIPT)["build_model"])
    state = tmp_path / "oracle" / "tuner0.json"
    tuner.save()
    first = state.stat().st_ino
    tuner.save()
    assert state.stat().st_ino != first
    assert json.loads(state.read_text()) == tuner.get_state()
    assert json.loads((tmp_path / "oracle" / "oracle.json").read_text())["start_order"] == []
