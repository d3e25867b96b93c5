"""The compiled backend gives TFF's model after the same rounds (tff track), and runs alone without TFF."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tensorfleet import models
from tensorfleet.compat.keras import keras2
from tensorfleet.federated import Simulation, partition

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


@pytest.mark.tff
def test_compiled_backend_equals_tff_after_the_same_rounds(digits_flat):
    clients = partition(digits_flat.x_train, digits_flat.y_train, num_clients=20, scheme="dirichlet:0.5", seed=1)
    runs = {}
    for backend in ("tff", "compiled"):
        sim = Simulation(lambda: models.build("digits_mlp", hidden=16), clients, "fedadam", rounds=3,
                         clients_per_round=5, local_epochs=2, batch_size=8, dropout=0.2, seed=4, progress=False,
                         backend=backend, test_data=(digits_flat.x_test, digits_flat.y_test))
        history = sim.run()
        runs[backend] = (sim.final_weights(), history.rounds)
    (w_tff, h_tff), (w_fast, h_fast) = runs["tff"], runs["compiled"]
    assert len(w_tff) == len(w_fast) == 4
    for a, b in zip(w_tff, w_fast):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    for a, b in zip(h_tff, h_fast):
        assert a["num_examples"] == b["num_examples"] and a["participants"] == b["participants"]
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5)
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=1e-9)


def _tff_and_compiled(clients, algorithm, **options):
    """Final weights, round records and runtime of the same simulation on both backends."""
    runs = {}
    for backend in ("tff", "compiled"):
        sim = Simulation(lambda: models.build("digits_mlp", hidden=8), clients, algorithm, rounds=5, batch_size=8,
                         seed=7, progress=False, backend=backend, **options)
        sim.run()
        runs[backend] = (sim.final_weights(), sim.history.rounds, sim.runtime)
    return runs["tff"], runs["compiled"]


@pytest.mark.tff
@pytest.mark.parametrize("algorithm,options", [
    ("fedsgd", {"straggler_deadline": 0.08, "client_speed": 500.0}),
    ("fedprox", {"algorithm_options": {"mu": 0.5}, "eval_clients": 3}),
])
def test_fedsgd_and_fedprox_on_compiled_equal_tff_after_5_rounds(digits_flat, algorithm, options):
    clients = partition(digits_flat.x_train[:400], digits_flat.y_train[:400], num_clients=12, scheme="dirichlet:0.5",
                        seed=3)
    (w_tff, h_tff, _), (w_fast, h_fast, runtime) = _tff_and_compiled(clients, algorithm, clients_per_round=4,
                                                                     dropout=0.1, **options)
    assert runtime is None  # no TFF worker started for the compiled run
    for a, b in zip(w_tff, w_fast):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    assert [r["stragglers"] for r in h_fast] == [r["stragglers"] for r in h_tff]
    assert ("straggler_deadline" in options) == (sum(r["stragglers"] for r in h_fast) > 0)
    for a, b in zip(h_tff, h_fast):
        assert a["num_examples"] == b["num_examples"] and a["participants"] == b["participants"]
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5)
        assert b["train_accuracy"] == pytest.approx(a["train_accuracy"], abs=1e-6)
        for key in ("fed_eval_loss", "fed_eval_accuracy"):
            assert (key in a) == (key in b) and b.get(key) == pytest.approx(a.get(key), abs=1e-5)


@pytest.mark.tff
@pytest.mark.parametrize("algorithm,aggregator,options", [
    ("fedavg", "median", {}),
    ("fedsgd", "trimmed_mean", {"beta": 0.2}),
    ("fedprox", "krum", {"num_byzantine": 1, "num_selected": 2}),
    ("fedavgm", "dp_fixed", {"noise_multiplier": 0.0, "clip": 0.05}),
    ("fedavg", "dp_adaptive", {"noise_multiplier": 0.0, "clip": 0.05, "clip_learning_rate": 0.5}),
    ("fedprox", "compression", {"bits": 4, "sparsity": 0.5}),
    ("fedsgd", "compression", {"bits": 8}),
])
def test_aggregators_on_compiled_equal_tff_after_5_rounds(digits_flat, algorithm, aggregator, options):
    clients = partition(digits_flat.x_train[:400], digits_flat.y_train[:400], num_clients=12, scheme="dirichlet:0.5",
                        seed=3)
    (w_tff, h_tff, _), (w_fast, h_fast, _) = _tff_and_compiled(
        clients, algorithm, clients_per_round=5, aggregator=aggregator, aggregator_options=options)
    assert h_fast[0]["participants"] == 5
    for key in ("upload_bytes", "epsilon"):
        assert [r.get(key) for r in h_fast] == [r.get(key) for r in h_tff]
    for a, b in zip(w_tff, w_fast):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    for a, b in zip(h_tff, h_fast):
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5)


@pytest.mark.tff
def test_compiled_backend_refuses_a_tff_aggregation_factory(digits_flat):
    import tensorflow_federated as tff

    from tensorfleet.federated.backends.compiled.scope import compiled_aggregators, compiled_algorithms

    clients = partition(digits_flat.x_train, digits_flat.y_train, num_clients=10, seed=0)
    with pytest.raises(ValueError, match=rf"backend='compiled' runs {', '.join(compiled_algorithms())} with the "
                                         rf"{re.escape(', '.join(compiled_aggregators()))} aggregators on "
                                         r"partition\(\) client data. Received: algorithm='fedprox', "
                                         r"aggregator='MeanFactory'"):
        Simulation(lambda: models.build("digits_mlp"), clients, "fedprox", backend="compiled",
                   aggregator=tff.aggregators.MeanFactory())


def test_compiled_backend_refuses_what_it_does_not_run(digits_flat):
    clients = partition(digits_flat.x_train, digits_flat.y_train, num_clients=10, seed=0)
    with pytest.raises(ValueError, match=r"backend must be one of 'tff', 'compiled', 'auto'. Received: backend='gpu'"):
        Simulation(lambda: models.build("digits_mlp"), clients, backend="gpu")
    with pytest.raises(ValueError, match=r"workers must not repeat an address. Received: '127.0.0.1:8000' twice"):
        Simulation(lambda: models.build("digits_mlp"), clients, backend="compiled", workers="127.0.0.1:8000,"
                                                                                           "127.0.0.1:8000")


@pytest.mark.parametrize("aggregator,options", [
    (None, {}),
    # noise on and the clip adapting: the resumed run draws the same noise and resumes the clip
    ("dp_adaptive", {"noise_multiplier": 0.1, "clip": 0.05}),
])
def test_compiled_backend_resumes_from_its_checkpoint_to_the_straight_model(digits_flat, tmp_path, aggregator,
                                                                             options):
    clients = partition(digits_flat.x_train, digits_flat.y_train, num_clients=10, scheme="iid", seed=2)

    def sim(rounds, out):
        return Simulation(lambda: models.build("digits_mlp", hidden=8), clients, "fedavgm", rounds=rounds,
                          clients_per_round=4, seed=5, progress=False, backend="compiled", out_dir=out,
                          checkpoint_every=1, tensorboard=False, aggregator=aggregator, aggregator_options=options)

    straight = sim(4, tmp_path / "straight")
    straight.run()
    sim(2, tmp_path / "split").run()
    resumed = sim(4, tmp_path / "split")
    history = resumed.run()
    assert [r["round"] for r in history.rounds] == [1, 2, 3, 4]
    for a, b in zip(straight.final_weights(), resumed.final_weights()):
        np.testing.assert_array_equal(a, b)
    if aggregator is not None:
        assert resumed.rounds.engine.clip == straight.rounds.engine.clip != 0.05


def _with_batch_norm():

    inner = tf_keras.Sequential([tf_keras.layers.BatchNormalization(name="bn")], name="block")
    return tf_keras.Sequential([tf_keras.layers.Dense(16, input_shape=(64,)), inner, tf_keras.layers.ReLU(),
                                tf_keras.layers.Dense(10)])


def _centering():
    import tensorflow as tf

    # Subtracts the batch mean: a row's output depends on the other rows, with no BatchNormalization.
    return tf_keras.Sequential([tf_keras.layers.Dense(10, input_shape=(64,)),
                                tf_keras.layers.Lambda(lambda t: t - tf.reduce_mean(t, axis=0))])


def test_compiled_backend_refuses_batch_dependent_layers_before_the_first_round(digits_flat):
    found = "a layer of the model (its output for a row changes when zero rows join the batch)"
    clients = partition(digits_flat.x_train, digits_flat.y_train, num_clients=10, seed=0)
    sim = Simulation(_centering, clients, rounds=1, clients_per_round=4, backend="compiled", progress=False)
    from tensorfleet.federated.backends.compiled.scope import compiled_aggregators, compiled_algorithms

    assert compiled_algorithms()[:8] == ["fedavg", "fedsgd", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad",
                                         "fednova"]
    assert compiled_aggregators()[:7] == ["mean", "dp_fixed", "dp_adaptive", "compression", "median", "trimmed_mean",
                                          "krum"]
    with pytest.raises(ValueError, match=rf"^backend='compiled' runs {', '.join(compiled_algorithms())} with the "
                                         rf"{re.escape(', '.join(compiled_aggregators()))} aggregators on "
                                         r"partition\(\) client data. Received: a model with "
                                         rf"batch-dependent layers \({re.escape(found)}\): this backend's equality "
                                         r"with TFF is tested on models whose rows do not mix at inference; "
                                         r"backend='tff' or 'auto' runs it \(tff track\)$"):
        sim.run()
    assert sim.history.rounds == [] and sim.rounds is None


@pytest.mark.tff
def test_a_batch_normalization_model_on_compiled_equals_tff(digits_flat):

    # With non_trainable="initial" the server keeps BatchNormalization's moving statistics at their initial values
    # on both backends (TFF's clients send trainable deltas only), and training normalizes over the same rows: the
    # same weights and evaluations after the same rounds. (The compiled default, "mean", is refused on tff.)
    def with_batch_norm():
        init = [tf_keras.initializers.GlorotUniform(seed=k) for k in (0, 1)]
        return tf_keras.Sequential([tf_keras.layers.Dense(16, input_shape=(64,), kernel_initializer=init[0]),
                                    tf_keras.layers.BatchNormalization(), tf_keras.layers.ReLU(),
                                    tf_keras.layers.Dense(10, kernel_initializer=init[1])])

    clients = partition(digits_flat.x_train[:400], digits_flat.y_train[:400], num_clients=12, scheme="dirichlet:0.5",
                        seed=3)
    runs = {}
    for backend in ("tff", "compiled"):
        sim = Simulation(with_batch_norm, clients, "fedavgm", rounds=4, clients_per_round=5, batch_size=8, seed=7,
                         progress=False, backend=backend, test_data=(digits_flat.x_test, digits_flat.y_test),
                         eval_clients=2, non_trainable="initial")
        rounds = sim.run().rounds
        runs[backend] = (sim.final_weights(), rounds)
    refused = Simulation(with_batch_norm, clients, rounds=1, clients_per_round=5, progress=False, backend="tff")
    with pytest.raises(ValueError, match=r"^backend='tff' keeps a model's non-trainable weights .* Received: "
                                         r"non_trainable='mean' for a model with 2 of them; pass"):
        refused.run()
    for a, b in zip(runs["tff"][0], runs["compiled"][0]):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    for a, b in zip(runs["tff"][1], runs["compiled"][1]):
        for key in ("train_loss", "test_loss", "fed_eval_loss"):
            assert b[key] == pytest.approx(a[key], abs=1e-5)
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=1e-9)


@pytest.mark.tff
def test_auto_backend_runs_compiled_where_it_equals_tff_and_tff_elsewhere(digits_flat):
    import tensorflow_federated as tff

    clients = partition(digits_flat.x_train, digits_flat.y_train, num_clients=10, seed=0)

    def backend(model_fn, algorithm="fedavg", data=clients, **options):
        sim = Simulation(model_fn, data, algorithm, rounds=1, clients_per_round=4, backend="auto", progress=False,
                         **options)
        sim.run()
        assert sim.history.config["backend_requested"] == "auto"
        assert sim.header() == f"{algorithm} on {sim.backend.value} (chosen by auto)"
        return sim.backend.value, sim.history.config["backend"]

    assert backend(lambda: models.build("digits_mlp", hidden=8)) == ("compiled", "compiled")
    assert backend(_with_batch_norm) == ("compiled", "compiled")
    assert backend(_centering) == ("tff", "tff")
    assert backend(lambda: models.build("digits_mlp", hidden=8), "fedprox") == ("compiled", "compiled")
    assert backend(lambda: models.build("digits_mlp", hidden=8), "fedsgd") == ("compiled", "compiled")
    assert backend(lambda: models.build("digits_mlp", hidden=8), aggregator="trimmed_mean") == ("compiled", "compiled")
    assert backend(lambda: models.build("digits_mlp", hidden=8), aggregator=tff.aggregators.MeanFactory()) == \
        ("tff", "tff")


def test_dp_noise_of_the_compiled_backend_has_the_expected_distribution():
    import tensorflow as tf

    from tensorfleet.federated.aggregators.dp import dp_noised_mean

    # 5 clients each sending a vector of norm 2, clipped to 1: the mean is 1/sqrt(d) per
    # coordinate, the noise's stddev 0.05 * 1 / 5; each round draws its own noise, the same again for
    # the same seed and round (a resumed run draws what the uninterrupted one did).
    d, clients, draws, clip, noise_multiplier = 2000, 5, 10, 1.0, 0.05
    clipped = tf.clip_by_global_norm([tf.constant(np.full(d, 2 / np.sqrt(d), np.float32))], clip)[0][0] * clients
    ours = np.concatenate([np.asarray(dp_noised_mean(clipped, [d], clip * noise_multiplier, clients, 7, r))
                           for r in range(draws)])
    assert ours.mean() == pytest.approx(1 / np.sqrt(d), rel=0.02)
    assert ours.std() == pytest.approx(clip * noise_multiplier / clients, rel=0.02)
    assert len(set(ours[:d].round(6)) & set(ours[d:2 * d].round(6))) < d // 10  # rounds draw fresh noise
    again = np.asarray(dp_noised_mean(clipped, [d], clip * noise_multiplier, clients, 7, 1))
    np.testing.assert_array_equal(again, ours[d:2 * d])


@pytest.mark.tff
def test_dp_noise_on_compiled_matches_tff_distribution():
    import tensorflow as tf
    import tensorflow_federated as tff

    from tensorfleet.federated.aggregators import build_aggregator
    from tensorfleet.federated.aggregators.dp import dp_noised_mean
    from tensorfleet.federated.backends.tff import managed_context

    # 5 clients each sending a vector of norm 2, clipped to 1: the mean is 1/sqrt(d) per
    # coordinate, the noise's stddev 0.05 * 1 / 5.
    d, clients, draws, clip, noise_multiplier = 2000, 5, 10, 1.0, 0.05
    updates = [np.full(d, 2 / np.sqrt(d), np.float32) for _ in range(clients)]
    factory = build_aggregator("dp_fixed", clients_per_round=clients, noise_multiplier=noise_multiplier, clip=clip)
    process = factory.create(tff.to_type((np.float32, (d,))))
    with managed_context():
        state, theirs = process.initialize(), []
        for _ in range(draws):
            out = process.next(state, updates)
            state, theirs = out.state, theirs + [np.asarray(out.result)]
    clipped = tf.clip_by_global_norm([tf.constant(u) for u in updates[:1]], clip)[0][0] * clients
    ours = [np.asarray(dp_noised_mean(clipped, [d], clip * noise_multiplier, clients, 7, r)) for r in range(draws)]
    theirs, ours = np.concatenate(theirs), np.concatenate(ours)
    expected_mean, expected_std = 1 / np.sqrt(d), clip * noise_multiplier / clients
    for sample in (theirs, ours):
        assert sample.mean() == pytest.approx(expected_mean, rel=0.02)
        assert sample.std() == pytest.approx(expected_std, rel=0.02)
    assert ours.mean() == pytest.approx(theirs.mean(), rel=0.02)
    assert ours.std() == pytest.approx(theirs.std(), rel=0.02)
    assert len(set(ours[:d].round(6)) & set(ours[d:2 * d].round(6))) < d // 10  # rounds draw fresh noise
