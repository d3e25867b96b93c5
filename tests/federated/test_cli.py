"""``tensorfleet federated`` through the CLI entry point."""

from __future__ import annotations

import json

import pytest

from tensorfleet.cli.main import main
from tensorfleet.compat.tff import tff_available

without_tff = pytest.mark.skipif(tff_available(), reason="tensorflow-federated imports here (the tff track)")


def test_algorithms_lists_every_algorithm_with_its_paper(capsys):
    assert main(["federated", "algorithms"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines][:8] == ["fedavg", "fedsgd", "fedprox", "fedavgm", "fedadam", "fedyogi",
                                                       "fedadagrad", "fednova"]
    assert "mu=0.01" in lines[2] and "[Li et al., MLSys 2020]" in lines[2]
    assert "[Wang et al., NeurIPS 2020]" in lines[7]


def test_aggregators_lists_options(capsys):
    assert main(["federated", "aggregators"]) == 0
    out = capsys.readouterr().out
    assert "trimmed_mean  options=beta" in out and "krum" in out and "dp_adaptive" in out
    assert "[compiled,tff] Weighted mean" in out


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
    (["--algorithm", "fedprox:nu=1"], "error: Algorithm 'fedprox' takes no option 'nu' (its options: mu). "
                                      "Received: nu=1"),
    (["--aggregator", "median:beta=1"], "error: Aggregator 'median' takes no option 'beta' (its options: "
                                        "none). Received: beta=1"),
    (["--dp", "noise=1.0"], "error: Aggregator 'dp_fixed' takes no option 'noise' (its options: noise_multiplier, "
                            "clip). Received: noise=1.0"),
    (["--model", "nofile.keras"],
     "error: No file 'nofile.keras', and no zoo model of that name. Available: digits_cnn"),
    (["--model", "digits_mpl"],
     "error: No file 'digits_mpl', and no zoo model of that name. Did you mean 'digits_mlp'?"),
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
    assert capsys.readouterr().err.startswith(f"error: No file at '{tmp_path / 'metrics.json'}': nothing is there; "
                                              "expected the metrics.json a run writes.")


@pytest.mark.tff
def test_run_on_tffs_synthetic_emnist_keeps_tffs_two_clients(capsys, tmp_path):
    assert main(["federated", "run", "--dataset", "emnist-synthetic", "--model", "digits_cnn", "--rounds", "1",
                 "--batch-size", "4", "--no-progress", "--out", str(tmp_path)]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["rounds"] == 1 and 0.0 <= last["train_accuracy"] <= 1.0 and "test_accuracy" not in last
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["config"]["num_train_clients"] == 2 and saved["config"]["clients_per_round"] == 2
    assert saved["config"]["clients"] == ("tff.simulation.datasets.emnist.get_synthetic() (pixels as x, label as y, "
                                          "x reshaped to (28, 28, 1))")
    assert saved["rounds"][0]["num_examples"] == 20  # TFF's 2 clients of 10 examples, not a re-split pool


@pytest.mark.tff
@pytest.mark.parametrize("argv,message", [
    (["--partition", "iid"], "error: emnist_synthetic keeps TFF's own clients; a partition scheme re-splits pooled "
                             "data (digits). Received: partition='iid'"),
    (["--clients", "4"], "error: num_clients must not exceed emnist_synthetic's 2 clients (TFF's own). "
                         "Received: num_clients=4"),
])
def test_tffs_synthetic_emnist_refuses_a_re_split(capsys, argv, message):
    assert main(["federated", "run", "--dataset", "emnist-synthetic", "--rounds", "1", *argv]) == 2
    assert capsys.readouterr().err.strip() == message


@pytest.mark.tff
def test_partition_summary_of_tffs_synthetic_emnist_shows_tffs_clients(capsys):
    assert main(["federated", "partition", "--dataset", "emnist-synthetic"]) == 0
    assert capsys.readouterr().out.strip() == ("2 clients, 20 samples; samples per client min 10 / mean 10.0 / max 10; "
                                               "labels per client min 10 / mean 10.00 / max 10")


def test_out_that_is_a_file_is_refused_before_the_run(capsys, tmp_path):
    taken = tmp_path / "taken.txt"
    taken.write_text("")
    assert main(["federated", "run", "--rounds", "1", "--out", str(taken)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: out_dir must be a directory; '{taken}' is a file. "
                                               f"Received: out_dir='{taken}'")


@pytest.mark.parametrize("text,message", [
    ("rounds: 2\nclients: [3\n", "is not valid YAML at line 3, column 1: expected ',' or ']', but got '<stream end>'."),
    ("rounds: 1\nrounds: 2\n", "is not valid YAML at line 2, column 1: the key 'rounds' is given twice (first at "
                             "line 1)."),
    ("rounds: 2.5\n", "rounds must be a positive integer. Received: rounds=2.5"),
    ("rounds: '3'\n", "rounds must be a positive integer. Received: rounds='3'"),
    ("progress: 'no'\n", "progress must be true or false. Received: progress='no'"),
    ("dropout: high\n", "dropout must be a finite number >= 0 and < 1. Received: dropout='high'"),
    ("model: 7\n", "model must be a name (text). Received: model=7"),
    ("dp: 1.0\n", "dp must be options such as 'noise_multiplier=1.0,clip=0.5' or a mapping of them. Received: dp=1.0"),
])
def test_bad_yaml_and_wrong_typed_values_name_the_key(capsys, tmp_path, text, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert main(["federated", "run", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.strip().endswith(message) and "Traceback" not in err


def test_fewer_rounds_than_the_checkpoint_is_an_error_and_fresh_starts_over(capsys, tmp_path):
    base = ["federated", "run", "--clients", "10", "--clients-per-round", "2", "--no-progress", "--out", str(tmp_path),
            "--checkpoint-every", "1"]
    assert main([*base, "--rounds", "2"]) == 0
    capsys.readouterr()
    assert main([*base, "--rounds", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: The checkpoint in {tmp_path} was written after round 2, past rounds=1. Run with --rounds 2 or more "
        f"to continue it, or use another --out, or --fresh to start over (it overwrites the checkpoint).")
    assert main([*base, "--rounds", "2", "--seed", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: The checkpoint in {tmp_path} comes from a different configuration (seed: checkpoint 0 vs now 1). "
        f"Use another --out, or --fresh to start over (it overwrites the checkpoint).")
    assert main([*base, "--rounds", "1", "--fresh"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rounds"] == 1
    assert [r["round"] for r in json.loads((tmp_path / "metrics.json").read_text())["rounds"]] == [1]


@without_tff
@pytest.mark.parametrize("argv,needs", [
    (["run", "--rounds", "1", "--backend", "tff"], "backend='tff' runs rounds on tensorflow-federated"),
    (["run", "--rounds", "1", "--backend", "tff", "--workers", "127.0.0.1:8471"],
     "backend='tff' with workers= runs rounds on tensorflow-federated"),
    (["run", "--rounds", "1", "--dataset", "emnist-synthetic"], "the emnist_synthetic dataset (TFF's own) needs "
                                                                "tensorflow-federated"),
    (["partition", "--dataset", "emnist-synthetic"],
     "the emnist_synthetic dataset (TFF's own) needs tensorflow-federated"),
    (["worker", "--port", "8471", "--runtime", "tff"],
     "TFF's worker_binary comes with tensorflow-federated, which is not installed."),
])
def test_what_needs_tff_is_one_error_line_naming_the_tff_track_where_tff_is_missing(capsys, argv, needs):
    assert main(["federated", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {needs}") and "use the tff track (`make install-tff`" in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_run_on_the_default_backend_needs_no_tff_and_says_compiled(capsys, tmp_path):
    assert main(["federated", "run", "--clients", "20", "--partition", "dirichlet:0.5", "--rounds", "2",
                 "--clients-per-round", "4", "--aggregator", "trimmed_mean:beta=0.25", "--no-progress"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["backend"] == "compiled" and last["rounds"] == 2 and 0.0 <= last["test_accuracy"] <= 1.0


def test_the_result_line_is_strict_json_when_epsilon_is_unbounded(capsys):
    # Secure aggregation without noise spends an unbounded epsilon: JSON has no Infinity, so it is null.
    assert main(["federated", "run", "--clients", "12", "--rounds", "1", "--clients-per-round", "4",
                 "--aggregator", "secagg", "--no-progress"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    last = json.loads(line, parse_constant=lambda name: pytest.fail(f"not strict JSON: {name} in {line}"))
    assert last["rounds"] == 1 and last["epsilon"] is None


def test_a_model_path_that_is_no_keras_model_file_exits_2_naming_it(capsys, tmp_path):
    damaged = tmp_path / "damaged.keras"
    damaged.write_bytes(bytes(range(256)) * 4)
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    for model, message in [(tmp_path, f"error: model must be a zoo name or a saved Keras model file (.keras, .h5). "
                                      f"Received: model='{tmp_path}' (a folder)"),
                           (text, f"error: model must be a zoo name or a saved Keras model file (.keras, .h5). "
                                  f"Received: model='{text}' (another kind of file)"),
                           (damaged, f"error: {damaged}")]:
        assert main(["federated", "run", "--rounds", "1", "--model", str(model)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged.keras", "notes.txt"]


def test_older_names_in_yaml_and_flags_are_shown_as_warning_lines(capsys, tmp_path):
    # Python hides a DeprecationWarning outside __main__: the CLI shows tensorfleet's as one line each.
    cfg = tmp_path / "old.yaml"
    cfg.write_text(f"out: {tmp_path / 'run'}\nrounds: 0\n")
    assert main(["federated", "run", "--config", str(cfg), "--client-lr", "0.05"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: --client-lr is now --client-learning-rate; the older flag will stop working in the "
                   "next release.",
                   "warning: federated experiment: 'out' is now 'out_dir'; the older name will stop working in the "
                   "next release.",
                   "error: rounds must be a positive integer. Received: rounds=0"]
