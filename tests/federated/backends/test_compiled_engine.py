"""How the compiled backend's engine runs: traced once, state kept between rounds and runs."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from tensorfleet import models
from tensorfleet.compat.keras import keras2
from tensorfleet.federated import Simulation, partition

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


def _branchy_mlp(branch: bool):
    """digits_mlp's shape (seeded); with ``branch`` a layer whose Python ``if`` reads a tensor."""
    import tensorflow as tf

    class Branchy(tf_keras.layers.Layer):
        def call(self, x):
            if tf.reduce_max(x) > 1e6:  # never true here: the layer passes x through
                return x * 0.0
            return x

    init = [tf_keras.initializers.GlorotUniform(seed=k) for k in (0, 1)]
    layers = [tf_keras.layers.Dense(8, activation="relu", kernel_initializer=init[0], input_shape=(64,))]
    layers += [Branchy()] if branch else []
    return tf_keras.Sequential(layers + [tf_keras.layers.Dense(10, kernel_initializer=init[1])])


def _clients(digits_flat):
    return partition(digits_flat.x_train[:300], digits_flat.y_train[:300], num_clients=10, scheme="iid", seed=0)


def test_a_second_run_of_a_simulation_starts_again_from_the_initial_model(digits_flat):
    sim = Simulation(lambda: models.build("digits_mlp", hidden=8), _clients(digits_flat), "fedavgm", rounds=2,
                     clients_per_round=3, seed=1, progress=False, backend="compiled")
    sim.run()
    first = sim.final_weights()
    sim.run()
    assert len(sim.history.rounds) == 2
    for a, b in zip(first, sim.final_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_model_whose_python_branches_read_tensors_is_traced_with_autograph(digits_flat):
    import tensorflow as tf

    # Traced without AutoGraph first, such a model fails with this error...
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        tf.function(_branchy_mlp(True), autograph=False)(tf.zeros([2, 64]))
    # ...so the engine traces it again with AutoGraph, and trains it as the model without the branch.
    weights = {}
    for branch in (False, True):
        sim = Simulation(lambda: _branchy_mlp(branch), _clients(digits_flat), "fedavg", rounds=3, clients_per_round=4,
                         seed=2, progress=False, backend="compiled")
        sim.run()
        weights[branch] = sim.final_weights()
        assert [r["round"] for r in sim.history.rounds] == [1, 2, 3]
    for a, b in zip(weights[False], weights[True]):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)


@pytest.mark.parametrize("algorithm,aggregator,options", [
    ("fedavgm", None, {}),
    ("fedsgd", "median", {}),
    ("fedprox", "dp_fixed", {"noise_multiplier": 0.0, "clip": 0.05}),
    ("fedavg", "compression", {"bits": 8, "sparsity": 0.5}),
])
def test_lanes_train_clients_side_by_side_to_the_model_of_one_lane(digits_flat, monkeypatch, algorithm, aggregator,
                                                                     options):
    from tensorfleet.federated.backends.compiled import engine

    weights, records = {}, {}
    for lanes in (1, 3):  # 3 lanes for 5 clients: lanes of 2, 2 and 1 client
        monkeypatch.setattr(engine, "default_lanes", lambda clients_per_round, lanes=lanes: lanes)
        sim = Simulation(lambda: models.build("digits_mlp", hidden=8), _clients(digits_flat), algorithm, rounds=3,
                         clients_per_round=5, seed=3, progress=False, backend="compiled", aggregator=aggregator,
                         aggregator_options=options,
                         **({"algorithm_options": {"mu": 0.5}} if algorithm == "fedprox" else {}))
        sim.run()
        assert len(sim.rounds.engine._lanes) == lanes
        weights[lanes], records[lanes] = sim.final_weights(), sim.history.rounds
    for a, b in zip(weights[1], weights[3]):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)  # the same sums, added in another order
    for a, b in zip(records[1], records[3]):
        assert (a["num_examples"], a["participants"]) == (b["num_examples"], b["participants"])
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-6)
        assert b["train_accuracy"] == pytest.approx(a["train_accuracy"], abs=1e-9)


def test_lanes_must_be_a_positive_integer_and_follow_the_cores_and_the_cpu_quota(tmp_path):
    from tensorfleet.federated.aggregators.builtin import MeanPart
    from tensorfleet.federated.algorithms.client_work import LocalSteps
    from tensorfleet.federated.algorithms.optimizers import build
    from tensorfleet.federated.backends.compiled import CompiledFedAvg, RoundShape, default_lanes

    cores = len(os.sched_getaffinity(0))
    assert default_lanes(1) == 1 and default_lanes(100, cpu_max=str(tmp_path / "absent")) == min(100, cores)
    for quota, lanes in (("max 100000", min(100, cores)), ("150000 100000", min(2, cores)), ("50000 100000", 1)):
        (tmp_path / "cpu.max").write_text(quota + "\n")
        assert default_lanes(100, cpu_max=str(tmp_path / "cpu.max")) == lanes
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match=rf"lanes must be a positive integer \(clients trained at once\)\. "
                                             rf"Received: {re.escape(repr(bad))}"):
            CompiledFedAvg(model_fn=lambda: models.build("digits_mlp", hidden=4), loss_fn=None,
                           client_work=LocalSteps(build("sgd", 0.1)), aggregator=MeanPart(),
                           server_optimizer=build("sgd", 1.0),
                           initial_weights=models.build("digits_mlp", hidden=4).get_weights(),
                           shape=RoundShape(batch_size=4, max_examples=8, clients_per_round=2, lanes=bad))


@pytest.mark.parametrize("size,sparsity,bits", [(10, 0.5, 32), (4608, 0.5, 8), (32768, 0.3, 4), (32768, 0.5, 32)])
def test_compiled_compression_keeps_what_the_reference_keeps_ties_included(size, sparsity, bits):
    import tensorflow as tf

    from tensorfleet.federated.aggregators.aggregate import quantize, sparsify
    from tensorfleet.federated.aggregators.compression import compress_rows

    # Few distinct magnitudes, so the kept count falls inside a run of ties (and zeros).
    values = np.random.default_rng(size).integers(-3, 4, size).astype(np.float32) * 0.25
    ours = compress_rows(tf.constant(values[None]), bits=bits, sparsity=sparsity).numpy()[0]
    reference = sparsify(values, sparsity)
    reference = quantize(reference, bits) if bits < 32 else reference
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-6)
    assert np.count_nonzero(ours[np.abs(values) == 0.75]) == np.count_nonzero(np.abs(values) == 0.75)


@pytest.mark.parametrize("size,sparsity,bits", [(10, 0.5, 32), (144, 0.5, 8), (4608, 0.5, 8), (32768, 0.3, 4),
                                                (32768, 0.5, 32), (3000, 0.0, 8)])
def test_compiled_compression_of_rows_equals_the_reference_on_each_row_traced_or_not(size, sparsity, bits):
    import tensorflow as tf

    from tensorfleet.federated.aggregators.aggregate import quantize, sparsify
    from tensorfleet.federated.aggregators.compression import Compression, compress_rows

    rng = np.random.default_rng(size)
    rows = np.stack([
        rng.integers(-3, 4, size).astype(np.float32) * 0.25,  # few distinct magnitudes: ties inside the kept count
        rng.normal(size=size).astype(np.float32) * 1e-3,
        np.zeros(size, np.float32),  # a padding slot or a non-finite update (weight 0)
        np.full(size, -0.5, np.float32),  # all ties
        np.where(rng.random(size) < 0.9, 0.0, rng.normal(size=size)).astype(np.float32),  # mostly zeros
        np.round(rng.normal(size=size), 2).astype(np.float32),  # a few equal magnitudes at the k-th value
    ])

    def reference(row):  # the numpy rules in float64; a float32 rounding tie may land one level away
        kept = sparsify(row.astype(np.float64), sparsity)
        if bits >= 32:
            return kept, 0.0
        return quantize(kept, bits), (kept.max() - kept.min()) / (2 ** bits - 1) * 1.0001 + 1e-7

    ours = compress_rows(tf.constant(rows), bits=bits, sparsity=sparsity).numpy()
    traced = tf.function(lambda r: compress_rows(r, bits=bits, sparsity=sparsity), autograph=False,
                         input_signature=[tf.TensorSpec([None, size], tf.float32)])
    one = Compression(bits=bits, sparsity=sparsity)
    for i, row in enumerate(rows):
        expected, level = reference(row)
        np.testing.assert_allclose(ours[i], expected, rtol=0, atol=level + 1e-6, err_msg=f"row {i}")
        np.testing.assert_allclose(one.compress(tf.constant(row)).numpy(), expected, rtol=0, atol=level + 1e-6)
    # Traced, as the round and TFF run it, on the rows of one round (with many ties past the k-th
    # value, none, and a few).
    for chosen in ([0, 1], [1], [5], [1, 5]):
        for i, row in zip(chosen, traced(tf.constant(rows[chosen])).numpy()):
            expected, level = reference(rows[i])
            np.testing.assert_allclose(row, expected, rtol=0, atol=level + 1e-6, err_msg=f"traced row {i}")
