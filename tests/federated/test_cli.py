"""``tensorfleet federated`` through the CLI entry point."""

from __future__ import annotations

import json

import pytest

from tensorfleet.cli.main import main


def test_algorithms_lists_every_algorithm_with_its_paper(capsys):
    assert main(["federated", "algorithms"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["fedavg", "fedsgd", "fedprox", "fedavgm", "fedadam", "fedyogi",
                                                   "fedadagrad"]
    assert "mu=0.01" in lines[2] and "[Li et al., MLSys 2020]" in lines[2]


def test_aggregators_lists_options(capsys):
    assert main(["federated", "aggregators"]) == 0
    out = capsys.readouterr().out
    assert "trimmed_mean  options=beta" in out and "krum" in out and "dp_adaptive" in out


def test_partition_writes_summary_and_plot(capsys, tmp_path):
    assert main(["federated", "partition", "--clients", "10", "--partition", "shards:2", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("10 clients, 1438 samples")
    assert (tmp_path / "partition.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "partition.json").read_text())["num_clients"] == 10


@pytest.mark.parametrize("argv,message", [
    (["--algorithm", "fedsdg"], "error: Unknown algorithm 'fedsdg'. Did you mean 'fedsgd'?"),
    (["--partition", "dirichlet:0"], "error: alpha must be a finite number > 0. Received: alpha=0.0"),
    (["--clients", "2000"], "error: num_clients must not exceed the number of samples (1438)"),
    (["--clients", "5", "--clients-per-round", "6"],
     "error: clients_per_round must not exceed the number of training clients (5). Received: clients_per_round=6"),
    (["--aggregator", "mediam"], "error: Unknown aggregator 'mediam'. Did you mean 'median'?"),
])
def test_bad_run_arguments_exit_2_with_one_clean_line(capsys, argv, message):
    assert main(["federated", "run", "--rounds", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and "Traceback" not in err


def test_unknown_config_key_is_refused(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rounds: 1\nlearning_rate: 0.1\n")
    assert main(["federated", "run", "--config", str(cfg)]) == 2
    assert capsys.readouterr().err.startswith("error: Unknown config key 'learning_rate'. Known keys: model, dataset,")


def test_run_from_yaml_with_flag_override_then_plot(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dataset: digits\nclients: 20\npartition: dirichlet:0.5\nalgorithm: fedavg\nrounds: 5\n"
                   "clients-per-round: 4\ndropout: 0.1\n")
    out = tmp_path / "run"
    assert main(["federated", "run", "--config", str(cfg), "--rounds", "2", "--dp", "noise_multiplier=0.5,clip=1.0",
                 "--out", str(out), "--no-progress"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["rounds"] == 2 and last["algorithm"] == "fedavg" and last["epsilon"] > 0
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["config"]["aggregator"] == "dp_fixed" and saved["config"]["dropout"] == 0.1
    (out / "accuracy.png").unlink()
    capsys.readouterr()
    assert main(["federated", "plot", str(out)]) == 0
    assert capsys.readouterr().out.split() == [str(out / f"{name}.png") for name in ("accuracy", "loss", "epsilon")]
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_of_a_directory_without_metrics_fails_cleanly(capsys, tmp_path):
    assert main(["federated", "plot", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: No metrics.json in {tmp_path}")


def test_run_on_tffs_synthetic_emnist(capsys):
    assert main(["federated", "run", "--dataset", "emnist-synthetic", "--model", "digits_cnn", "--clients", "4",
                 "--clients-per-round", "2", "--rounds", "1", "--batch-size", "4", "--no-progress"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["rounds"] == 1 and 0.0 <= last["test_accuracy"] <= 1.0
