"""Plots of a run say what the run was: DP, robust or compressed aggregation, and the epsilon spent."""

from __future__ import annotations

import pytest

from tensorfleet.federated.history import History, history_figures, plot_history, run_title

ROUNDS = [{"round": 1, "train_accuracy": 0.5, "train_loss": 1.2, "epsilon": 1.25},
          {"round": 2, "train_accuracy": 0.75, "train_loss": 0.8, "epsilon": 1.875}]


def _titles(history):
    return {name: fig.axes[0].get_title() for name, fig in history_figures(history).items()}


def test_a_dp_run_says_so_with_its_epsilon_and_plots_epsilon(tmp_path):
    config = {"algorithm": "fedavg", "aggregator": "dp_fixed",
              "aggregator_options": {"noise_multiplier": 0.5, "clip": 1.0}, "dp_delta": 1e-5}
    history = History(rounds=ROUNDS, config=config)
    label = "fedavg with DP (dp_fixed, noise_multiplier=0.5, clip=1.0), ε=1.88 at δ=1e-05"
    assert _titles(history) == {"accuracy": f"{label}\naccuracy per round", "loss": f"{label}\nloss per round",
                                "epsilon": f"{label}\nprivacy spent per round"}
    assert [p.name for p in plot_history(history, tmp_path)] == ["accuracy.png", "loss.png", "epsilon.png"]
    assert (tmp_path / "epsilon.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("aggregator,options,label", [
    (None, {}, "fedavg"),
    ("mean", {}, "fedavg"),
    ("krum", {"num_byzantine": 1}, "fedavg with robust aggregation (krum, num_byzantine=1)"),
    ("trimmed_mean", {}, "fedavg with robust aggregation (trimmed_mean)"),
    ("compression", {"bits": 8}, "fedavg with compressed updates (compression, bits=8)"),
])
def test_a_robust_or_compressed_run_says_so_and_plots_no_epsilon(aggregator, options, label):
    rounds = [{k: v for k, v in r.items() if k != "epsilon"} for r in ROUNDS]
    history = History(rounds=rounds, config={"algorithm": "fedavg", "aggregator": aggregator,
                                             "aggregator_options": options})
    assert run_title(history.config) == label
    assert _titles(history) == {"accuracy": f"{label}\naccuracy per round", "loss": f"{label}\nloss per round"}


@pytest.mark.parametrize("content", [b"", bytes(range(256)), b'{"rounds": 3}', b"[1, 2]", b'{"config": {}}'])
def test_a_damaged_metrics_json_is_one_error_naming_the_file(tmp_path, content):
    from tensorfleet.federated.history import load_history
    from tensorfleet.io import UnreadableFileError

    (tmp_path / "metrics.json").write_bytes(content)
    with pytest.raises(UnreadableFileError, match=str(tmp_path / "metrics.json")):
        load_history(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
