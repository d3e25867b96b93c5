"""`tensorfleet federated tune`: Keras Tuner's oracle over federated simulations."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from tensorfleet.cli.tune import FederatedObjective, federated_trial, federated_tune_command
from tensorfleet.tuning.blackbox import search_function

CONFIG = """\
dataset: digits
clients: 10
partition: iid
rounds: 3
batch_size: 32
"""


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("tune")(federated_tune_command)
    app.command("run")(lambda: None)  # a group, as `tensorfleet federated` is
    return app


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_each_trial_is_a_simulation_and_the_best_score_is_a_fresh_runs(tmp_path):
    (tmp_path / "exp.yaml").write_text(CONFIG)
    out = tmp_path / "search"
    result = CliRunner().invoke(_app(), ["tune", "--config", str(tmp_path / "exp.yaml"), "--max-trials", "3",
                                         "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "results.json").read_text())
    assert [t["status"] for t in summary["trials"]] == ["COMPLETED"] * 3
    assert [list(t["hyperparameters"]) for t in summary["trials"]] == [
        ["client_learning_rate", "server_learning_rate", "local_epochs", "clients_per_round"]] * 3
    for trial in summary["trials"]:
        assert 1 <= trial["hyperparameters"]["local_epochs"] <= 3
        assert 2 <= trial["hyperparameters"]["clients_per_round"] <= 10
    best = summary["best"]
    assert best["score"] == max(t["score"] for t in summary["trials"])
    from tensorfleet.federated.experiment import load_config, resolve_config

    cfg = resolve_config({**load_config(tmp_path / "exp.yaml"), "backend": "auto"})
    assert federated_trial(cfg, best["hyperparameters"], FederatedObjective.FINAL_ACCURACY, 0.8) == best["score"]
    assert "3 of 3 trials completed" in result.output


def test_a_bad_objective_is_refused_with_the_choices(tmp_path):
    (tmp_path / "exp.yaml").write_text(CONFIG)
    result = CliRunner().invoke(_app(), ["tune", "--config", str(tmp_path / "exp.yaml"), "--objective", "loss"])
    assert isinstance(result.exception, ValueError)
    assert str(result.exception) == ("objective must be one of 'final_accuracy', 'rounds_to_target'. "
                                     "Received: objective='loss'")


def test_a_function_search_resumes_with_the_trial_that_was_running(tmp_path):
    calls: list[float] = []

    def space(hp):
        hp.Float("x", -2.0, 2.0)

    def fail_on_third(values):
        calls.append(values["x"])
        if len(calls) == 3:
            raise KeyboardInterrupt  # the search stops here, as a killed process would
        return (values["x"] - 1) ** 2

    with pytest.raises(KeyboardInterrupt):
        search_function(fail_on_third, space, objective="loss", direction="min", max_trials=4, out_dir=tmp_path,
                        log=lambda line: None)
    result = search_function(lambda v: (v["x"] - 1) ** 2, space, objective="loss", direction="min", max_trials=4,
                             out_dir=tmp_path, resume=True, log=lambda line: None)
    assert [r.status for r in result.trials] == ["COMPLETED"] * 4
    assert [r.hyperparameters["x"] for r in result.trials[:3]] == calls  # the third ran again, same values
    assert result.best.score == min((x - 1) ** 2 for x in [r.hyperparameters["x"] for r in result.trials])
    with pytest.raises(ValueError, match="Hyperband needs trials that train for a number of epochs"):
        search_function(lambda v: 0.0, space, objective="loss", direction="min", max_trials=1,
                        out_dir=tmp_path / "hb", algorithm="hyperband")


def test_the_tensorfleet_command_has_federated_tune(tmp_path, capsys):
    from tensorfleet.cli.main import main

    assert main(["federated", "tune", "--config", str(tmp_path / "none.yaml"), "--max-trials", "2"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: No file at {str(tmp_path / 'none.yaml')!r}: nothing is there; "
                                               "expected a YAML config file (a mapping of the run's keys).")
