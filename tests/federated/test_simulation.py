"""Simulation with a tiny MLP on digits: history, files, sampling, errors, algorithms, attack (on the default
backend, auto, unless a test is about TFF's runtime)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tensorfleet import models
from tensorfleet.compat.keras import keras2
from tensorfleet.federated import ALGORITHMS, Simulation, partition
from tensorfleet.registry import UnknownNameError

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

TFF = pytest.param("tff", marks=pytest.mark.tff)


@pytest.fixture(scope="module")
def clients(digits_flat):
    return partition(digits_flat.x_train, digits_flat.y_train, num_clients=20, scheme="iid", seed=0)


def tiny():
    return models.build("digits_mlp", hidden=16)


@pytest.mark.parametrize("backend", ["compiled", TFF])
def test_run_writes_history_metrics_plots_and_checkpoint(digits_flat, clients, tmp_path, backend):
    sim = Simulation(tiny, clients, "fedavg", rounds=3, clients_per_round=5,
                     test_data=(digits_flat.x_test, digits_flat.y_test), eval_clients=4, eval_every=2, out_dir=tmp_path,
                     checkpoint_every=2, progress=False, backend=backend)
    history = sim.run()
    assert [r["round"] for r in history.rounds] == [1, 2, 3]
    assert [("test_accuracy" in r, "fed_eval_accuracy" in r) for r in history.rounds] == \
        [(False, False), (True, True), (True, True)]
    assert all(r["clients"] == 5 and r["participants"] == 5 for r in history.rounds)
    # 64*16 + 16 + 16*10 + 10 float32 parameters per client upload
    assert history.rounds[0]["upload_bytes"] == 5 * 4 * (64 * 16 + 16 + 16 * 10 + 10)
    assert history.final("test_accuracy") > 0.15
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert [r["round"] for r in saved["rounds"]] == [1, 2, 3] and saved["config"]["algorithm"] == "fedavg"
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0].startswith("round,clients,participants")
    for png in ("accuracy.png", "loss.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert list((tmp_path / "tensorboard").iterdir())
    assert (tmp_path / "checkpoint.npz").is_file()
    assert not list(tmp_path.glob(".*.tmp"))
    if backend == "tff":
        assert not sim.runtime.worker.running  # the TFF worker stops with the run
    else:
        assert sim.runtime is None  # no TFF worker at all


@pytest.mark.parametrize("backend", ["compiled", TFF])
def test_central_evaluation_is_the_final_model_s_loss_and_accuracy_on_the_test_data(digits_flat, clients, backend):

    # 718 test rows: one traced step over a batch of 512 rows and one of 206, with the model's own loss
    x, y = np.concatenate([digits_flat.x_test] * 2), np.concatenate([digits_flat.y_test] * 2)
    sim = Simulation(tiny, clients, "fedavg", rounds=2, clients_per_round=5, backend=backend, progress=False,
                     test_data=(x, y), eval_every=1)
    history = sim.run()
    model = tiny()
    sim.model_weights(sim.state).assign_weights_to(model)
    logits = model(x, training=False).numpy()
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
    assert history.final("test_accuracy") == np.mean(np.argmax(logits, axis=-1) == y)
    assert history.final("test_loss") == pytest.approx(float(loss), rel=1e-6)
    assert history.rounds[0]["test_loss"] != history.rounds[1]["test_loss"]  # each round's own weights


def test_sampling_dropout_and_stragglers_are_seeded(clients):
    sim = Simulation(tiny, clients, rounds=5, clients_per_round=10, seed=7, dropout=0.3, straggler_deadline=0.7,
                     progress=False)
    again = Simulation(tiny, clients, rounds=5, clients_per_round=10, seed=7, dropout=0.3, straggler_deadline=0.7,
                       progress=False)
    rounds = [sim.sample(r) for r in range(1, 6)]
    assert rounds == [again.sample(r) for r in range(1, 6)]
    assert rounds != [Simulation(tiny, clients, rounds=5, clients_per_round=10, seed=8, progress=False).sample(r)
                      for r in range(1, 6)]
    for who in rounds:
        assert len(who["sampled"]) == 10
        assert set(who["participants"]) == set(who["sampled"]) - set(who["dropped"]) - set(who["stragglers"])
    assert sum(len(w["dropped"]) for w in rounds) > 0 and sum(len(w["stragglers"]) for w in rounds) > 0


def test_dropped_clients_are_left_out_of_the_round(clients):
    sim = Simulation(tiny, clients, rounds=2, clients_per_round=10, seed=7, dropout=0.5, progress=False)
    history = sim.run()
    for record in history.rounds:
        who = sim.sample(record["round"])
        assert record["participants"] == len(who["participants"]) < 10
        sizes = sum(len(clients.indices(c)) for c in who["participants"])
        assert record["num_examples"] == sizes


@pytest.mark.parametrize("backend", [TFF, "compiled"])
def test_resume_from_a_checkpoint_of_another_configuration_is_refused(clients, tmp_path, backend):
    Simulation(tiny, clients, rounds=1, clients_per_round=5, out_dir=tmp_path, checkpoint_every=1, progress=False,
               backend=backend).run()
    other = Simulation(tiny, clients, rounds=2, clients_per_round=6, out_dir=tmp_path, checkpoint_every=1,
                       progress=False, backend=backend)
    from tensorfleet.federated.checkpoint import CheckpointMismatchError

    with pytest.raises(CheckpointMismatchError,
                       match=r"different configuration \(clients_per_round: checkpoint 5 vs now 6\)"):
        other.run()
    other_model = Simulation(lambda: models.build("digits_mlp", hidden=8), clients, rounds=2, clients_per_round=5,
                             out_dir=tmp_path, checkpoint_every=1, progress=False, backend=backend)
    with pytest.raises(CheckpointMismatchError, match=r"comes from another model: "
                                                      r"layer \d+ \(Dense\) has units=16 in the checkpoint, 8 now\."):
        other_model.run()


def test_resume_with_another_model_of_the_same_shapes_is_refused(clients, tmp_path):
    # The tensors' shapes match, so only the recorded architecture tells relu from tanh.
    def mlp(activation):
        return tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(16, activation=activation),
                                    tf_keras.layers.Dense(10)])

    def simulation(activation, rounds):
        return Simulation(lambda: mlp(activation), clients, rounds=rounds, clients_per_round=5, out_dir=tmp_path,
                          checkpoint_every=1, progress=False, backend="compiled")

    simulation("relu", 1).run()
    from tensorfleet.federated.checkpoint import CheckpointMismatchError

    with pytest.raises(CheckpointMismatchError) as refused:
        simulation("tanh", 2).run()
    assert str(refused.value) == (
        f"The checkpoint in {tmp_path} comes from another model: layer 0 (Dense) has "
        "activation='relu' in the checkpoint, 'tanh' now. Use another out_dir, or resume=False to start over.")
    # The same model built again (its layers named anew, dense_2 and so on) resumes at round 2.
    assert [r["round"] for r in simulation("relu", 2).run().rounds] == [1, 2]


def test_fewer_rounds_than_the_checkpoint_is_refused_unless_resume_is_off(clients, tmp_path):
    from tensorfleet.federated.checkpoint import CheckpointAheadError

    Simulation(tiny, clients, rounds=2, clients_per_round=2, out_dir=tmp_path, checkpoint_every=1,
               progress=False).run()
    with pytest.raises(CheckpointAheadError, match=rf"^The checkpoint in {tmp_path} was written after round 2, past "
                                                   r"rounds=1. Ask for rounds=2 or more to continue it, or use another "
                                                   r"out_dir, or resume=False to start over.$"):
        Simulation(tiny, clients, rounds=1, clients_per_round=2, out_dir=tmp_path, checkpoint_every=1,
                   progress=False).run()
    history = Simulation(tiny, clients, rounds=1, clients_per_round=2, out_dir=tmp_path, checkpoint_every=1,
                         resume=False, progress=False).run()
    assert [r["round"] for r in history.rounds] == [1]
    history = Simulation(tiny, clients, rounds=2, clients_per_round=2, out_dir=tmp_path, checkpoint_every=1,
                         resume=True, progress=False).run()  # True: it must continue, and does
    assert [r["round"] for r in history.rounds] == [1, 2]
    with pytest.raises(ValueError, match=r"^Nothing to resume in out_dir='.*/empty': it holds no checkpoint\. "
                                         r"Received: resume=True \(--resume\); leave resume unset "
                                         r"\(no --resume\) to begin a run\.$"):
        Simulation(tiny, clients, rounds=1, clients_per_round=2, out_dir=tmp_path / "empty", checkpoint_every=1,
                   resume=True, progress=False).run()


@pytest.mark.parametrize("kwargs,error,message", [
    ({"clients_per_round": 21}, ValueError,
     r"clients_per_round must not exceed the number of training clients \(20\). Received: clients_per_round=21"),
    ({"rounds": 0}, ValueError, r"rounds must be a positive integer. Received: rounds=0"),
    ({"dropout": 1.0}, ValueError, r"dropout must be a finite number >= 0 and < 1. Received: dropout=1.0"),
    ({"algorithm": "fedavgg"}, UnknownNameError, r"Unknown algorithm 'fedavgg'. Did you mean 'fedavg'\? Available: "
                                                 r"fedavg, fedsgd, fedprox, fedavgm, fedadam, fedyogi, fedadagrad."),
    ({"aggregator": "medain"}, UnknownNameError, r"Unknown aggregator 'medain'. Did you mean 'median'\?"),
    ({"algorithm": "fedavg", "algorithm_options": {"mu": 0.1}}, TypeError,
     r"Algorithm 'fedavg' takes no option 'mu' \(its options: none\). Received: mu=0.1"),
    ({"colour": "blue"}, TypeError, r"Simulation takes no option 'colour'. Its options: algorithm, rounds, "),
    ({"checkpoint_every": 1}, ValueError,
     r"checkpoint_every needs an out_dir. Received: checkpoint_every=1, out_dir=None"),
    ({"aggregator": "krum", "aggregator_options": {"num_byzantine": 2}, "clients_per_round": 6}, ValueError,
     r"Aggregator 'krum' needs at least 7 clients \(n > 2 \* num_byzantine \+ 2, Blanchard et al. 2017; "
     r"num_byzantine=2\). Received: clients_per_round=6"),
    ({"aggregator": "dp_adaptive", "aggregator_options": {"noise_multiplier": 1.0}, "clients_per_round": 10},
     ValueError,
     r"dp_adaptive's clipped-count noise \(0.05 \* clients_per_round = 0.5\) is too low for noise_multiplier=1: it "
     r"needs noise_multiplier < 0.1 \* clients_per_round. Received: noise_multiplier=1, clients_per_round=10; "),
    ({"progress": "no"}, ValueError, r"progress must be true or false. Received: progress='no'"),
    ({"resume": 0}, ValueError, r"resume must be None, true or false. Received: resume=0"),
    ({"dp_delta": 1}, ValueError, r"dp_delta must be a finite number > 0 and < 1. Received: dp_delta=1"),
    ({"out_dir": "/proc/version"}, ValueError,
     r"out_dir must be a directory; '/proc/version' is a file. Received: out_dir='/proc/version'"),
    ({"eval_clients": 20}, ValueError,
     r"eval_clients must leave at least one training client \(20 clients\). Received: eval_clients=20"),
])
def test_bad_arguments_fail_at_construction(clients, kwargs, error, message):
    with pytest.raises(error, match=message):
        Simulation(tiny, clients, **kwargs)


@pytest.mark.parametrize("keras_name", ["keras3", "tf_keras"])
def test_a_built_model_in_place_of_model_fn_is_refused_at_construction(clients, keras_name):
    model = models.build("digits_mlp", keras=keras_name)
    with pytest.raises(TypeError, match=r"model_fn must be a no-argument callable that builds a new Keras model "
                                        r"\(the run builds its own copies from it\), not a model. Received: a model "
                                        r"of type Functional; pass a function, such as lambda: keras.Sequential"):
        Simulation(model, clients, rounds=1, clients_per_round=2, progress=False)


def test_a_model_whose_input_does_not_match_the_data_is_refused(clients):
    sim = Simulation(lambda: models.build("digits_cnn"), clients, rounds=1, clients_per_round=2, progress=False)
    with pytest.raises(ValueError, match=r"The model's input shape does not match the client data: the model takes "
                                         r"\(None, 8, 8, 1\), the examples have x of shape \(64,\)"):
        sim.run()


@pytest.mark.parametrize("backend", ["compiled", TFF])
@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_every_algorithm_runs_a_round(clients, algorithm, backend):
    options = {"mu": 0.1} if algorithm == "fedprox" else None
    if ALGORITHMS.get(algorithm).build is None and backend != "compiled":  # no TFF form: refused on tff at once
        with pytest.raises(ValueError, match=rf"^Algorithm '{algorithm}' runs on the compiled backend only"):
            Simulation(tiny, clients, algorithm, rounds=1, clients_per_round=2, progress=False, backend=backend)
        return
    history = Simulation(tiny, clients, algorithm, rounds=1, clients_per_round=2, algorithm_options=options,
                         progress=False, backend=backend).run()
    assert [r["round"] for r in history.rounds] == [1]
    assert all(np.isfinite(r["train_loss"]) for r in history.rounds)


def test_dp_run_reports_epsilon(clients):
    from tensorfleet.federated.aggregators.dp import epsilon

    history = Simulation(tiny, clients, rounds=2, clients_per_round=5, aggregator="dp_adaptive",
                         aggregator_options={"noise_multiplier": 0.1}, progress=False).run()
    # 5 of the 20 clients drawn without replacement each round, as the simulation samples them
    assert history.rounds[-1]["epsilon"] == epsilon(noise_multiplier=0.1, clients_per_round=5, num_clients=20,
                                                    rounds=2, delta=1e-5)
    assert history.config["dp_delta"] == 1e-5
    assert history.rounds[0]["epsilon"] < history.rounds[1]["epsilon"]


def test_compression_run_reports_fewer_upload_bytes(clients):
    history = Simulation(tiny, clients, rounds=1, clients_per_round=5, aggregator="compression",
                         aggregator_options={"bits": 8, "sparsity": 0.9}, progress=False).run()
    from tensorfleet.federated.aggregators.aggregate import compressed_bytes

    per_client = compressed_bytes([64 * 16, 16, 16 * 10, 10], bits=8, sparsity=0.9)
    assert history.rounds[0]["upload_bytes"] == 5 * per_client < 5 * 4 * 1210


def test_one_scaled_client_breaks_fedavg_but_not_the_robust_aggregators(digits_flat):
    from tensorfleet.federated.clients.attacks import scale_clients

    honest = partition(digits_flat.x_train, digits_flat.y_train, num_clients=10, scheme="iid", seed=0)
    attacked = scale_clients(honest, ["client_000"], factor=1000.0)

    def accuracy(data, aggregator=None):
        sim = Simulation(lambda: models.build("digits_mlp", hidden=32), data, "fedavg", rounds=6, clients_per_round=10,
                         aggregator=aggregator, test_data=(digits_flat.x_test, digits_flat.y_test), eval_every=6,
                         progress=False)
        return sim.run().final("test_accuracy")

    # Clean FedAvg with this set-up reaches about 0.7 after 6 rounds (measured); one attacker
    # scaling its features by 1000 drives it to chance, the robust rules stay near the clean run.
    assert accuracy(attacked) < 0.2
    assert accuracy(attacked, "median") > 0.55
    assert accuracy(attacked, "krum") > 0.5


def test_krum_round_left_with_too_few_clients_by_dropout_fails_before_training(clients):
    sim = Simulation(tiny, clients, rounds=2, clients_per_round=5, aggregator="krum", dropout=0.5, seed=0,
                     progress=False)
    who = sim.sample(1)
    assert len(who["participants"]) == 3 and len(who["dropped"]) == 2  # seed 0, measured
    with pytest.raises(ValueError, match=r"^Round 1: Aggregator 'krum' needs at least 5 clients .* "
                                         r"Received: participants=3 \(2 of 5 sampled clients "
                                         r"dropped out, 0 missed the straggler deadline\)$"):
        sim.run()
    assert sim.history.rounds == []
