"""A simulation's options are declared once (tensorfleet/federated/options.py) and reach every place that names
them: the Python API, the YAML keys, the flags of ``tensorfleet federated run``, the reference's table and the
checkpoint's fingerprint. A new option added to the declaration and missing from any of them fails here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tensorfleet.cli.main import main
from tensorfleet.federated.config import SimulationConfig
from tensorfleet.federated.experiment import DEFAULTS, KEYS, OPTIONS, resolve_config
from tensorfleet.federated.options import declared

SIMULATION = declared(SimulationConfig)
# What an option's example needs beside it to be a valid config.
COMPANIONS: dict[str, dict[str, Any]] = {"algorithm_options": {"algorithm": "fedprox"},
                                         "aggregator_options": {"aggregator": "trimmed_mean"},
                                         "checkpoint_every": {"out_dir": "runs/options"},
                                         "workers": {"backend": "compiled"},
                                         "round_timeout": {"workers": "127.0.0.1:8000", "backend": "compiled"}}
NEEDS_TFF: set[str] = set()  # options whose example needs the tff track


def test_every_option_is_declared_with_help_and_an_example_other_than_its_default():
    assert len(SIMULATION) == 29
    for name, info in {**SIMULATION, **OPTIONS}.items():
        assert info.help.strip() and info.help.endswith("."), name
        assert info.example != info.default, name
        assert info.flag.startswith("--"), name


def test_every_settable_option_is_a_yaml_key_and_a_flag_of_federated_run():
    import typer

    from tensorfleet.cli.main import app

    run = typer.main.get_command(app).commands["federated"].commands["run"]
    flags = {opt for param in run.params for opt in [*param.opts, *param.secondary_opts]}
    settable = [name for name, info in SIMULATION.items() if info.settable]
    assert set(settable) <= set(KEYS)
    for name, info in OPTIONS.items():
        assert set(info.flag.split("/")) <= flags, name
        for alias in info.aliases:
            assert f"--{alias.replace('_', '-')}" in flags, alias


@pytest.mark.parametrize("name", [n for n, info in SIMULATION.items() if info.trajectory])
def test_every_option_that_changes_the_trajectory_changes_the_fingerprint(name):
    if name in NEEDS_TFF:
        pytest.skip("workers need the tff track")
    base = SimulationConfig(**COMPANIONS.get(name, {}))
    changed = SimulationConfig(**{**COMPANIONS.get(name, {}), name: SIMULATION[name].example})
    assert base.trajectory() != changed.trajectory(), name


@pytest.mark.parametrize("name", [n for n, info in SIMULATION.items() if not info.trajectory])
def test_options_that_leave_the_trajectory_leave_the_fingerprint(name, tmp_path):
    if name in NEEDS_TFF:
        pytest.skip("workers need the tff track")
    companions = {k: (str(tmp_path / v) if k == "out_dir" else v) for k, v in COMPANIONS.get(name, {}).items()}
    value = SIMULATION[name].example
    value = str(tmp_path / value) if name == "out_dir" else value
    base = SimulationConfig(**companions)
    changed = SimulationConfig(**{**companions, name: value})
    strip = lambda t: {k: v for k, v in t.items() if k != "rounds"}  # noqa: E731  (a resumed run may extend it)
    assert strip(base.trajectory()) == strip(changed.trajectory()), name


@pytest.mark.parametrize("name", [n for n in KEYS if n not in NEEDS_TFF])
def test_every_key_takes_its_example_from_yaml(name, tmp_path):
    value = OPTIONS[name].example
    value = str(tmp_path / value) if name == "out_dir" else value
    resolved = resolve_config({name: value})
    assert set(resolved) == set(KEYS)
    assert resolved[name] is not None and resolved[name] != DEFAULTS[name], name


def test_older_key_names_still_work_with_a_deprecation_warning(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"'client_lr' is now 'client_learning_rate'"):
        resolved = resolve_config({"client_lr": 0.3, "out": str(tmp_path)})
    assert resolved["client_learning_rate"] == 0.3 and resolved["out_dir"] == str(tmp_path)
    with pytest.raises(ValueError, match=r"'server_lr' is the older name of 'server_learning_rate'; give one of them"):
        resolve_config({"server_lr": 0.3, "server_learning_rate": 0.5})


def _final(out: Any) -> dict[str, Any]:
    return json.loads((out / "metrics.json").read_text())["rounds"][-1]


def test_algorithm_options_from_the_flag_and_from_yaml_change_the_run_alike(tmp_path, capsys):
    common = ["federated", "run", "--rounds", "2", "--clients", "10", "--clients-per-round", "4", "--no-progress",
              "--local-epochs", "3", "--client-learning-rate", "0.5"]
    assert main([*common, "--algorithm", "fedprox:mu=0.0", "--out", str(tmp_path / "mu0")]) == 0
    assert main([*common, "--algorithm", "fedprox:mu=1.0", "--out", str(tmp_path / "flag")]) == 0
    (tmp_path / "mu1.yaml").write_text("algorithm: fedprox\nalgorithm_options:\n  mu: 1.0\n")
    assert main([*common, "--config", str(tmp_path / "mu1.yaml"), "--out", str(tmp_path / "yaml")]) == 0
    capsys.readouterr()
    mu0, flag, yaml = (_final(tmp_path / d) for d in ("mu0", "flag", "yaml"))
    assert json.loads((tmp_path / "flag" / "metrics.json").read_text())["config"]["algorithm_options"] == {"mu": 1.0}
    assert flag["train_loss"] == pytest.approx(yaml["train_loss"], abs=1e-6)
    assert abs(flag["train_loss"] - mu0["train_loss"]) > 1e-3  # the pull towards the server's weights acts


def test_an_algorithm_option_given_twice_is_refused(capsys, tmp_path):
    (tmp_path / "c.yaml").write_text("algorithm: fedprox:mu=0.1\nalgorithm_options: {mu: 1.0}\n")
    assert main(["federated", "run", "--config", str(tmp_path / "c.yaml"), "--rounds", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: algorithm option 'mu' is given twice: in "
                                              "algorithm='fedprox:mu=0.1' and in algorithm_options.")


def test_round_timeout_without_the_compiled_backends_workers_is_refused():
    with pytest.raises(ValueError,
                       match=r"^round_timeout applies to the compiled backend's workers \(workers=\[\.\.\.\] "
                                         r"with backend='compiled'\)\. Received: round_timeout=30 with backend="
                                         r"'auto', workers=None$"):
        SimulationConfig(round_timeout=30)
    with pytest.raises(ValueError, match=r"round_timeout must be a finite number > 0\. Received: round_timeout=0"):
        SimulationConfig(round_timeout=0, workers="127.0.0.1:8000", backend="compiled")


@pytest.mark.parametrize("option", ["client_optimizer", "server_optimizer"])
def test_the_optimizer_options_help_lists_every_registered_optimizer(option: str) -> None:
    from tensorfleet.federated import OPTIMIZERS

    listed = SIMULATION[option].help.rsplit(":", 1)[1].rstrip(".").replace(" ", "").split(",")
    assert sorted(listed) == sorted(OPTIMIZERS.names())
