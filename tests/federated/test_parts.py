"""The compiled round's parts against NumPy: a user's own aggregators registered and run on the compiled
backend, the built-in aggregators' compiled forms, FedNova, stragglers' partial work and BatchNormalization's
statistics."""

from __future__ import annotations

import numpy as np
import pytest

from tensorfleet import models
from tensorfleet.compat.keras import keras2
from tensorfleet.federated import Simulation, partition
from tensorfleet.federated.aggregators import AGGREGATORS, aggregate as agg
from tensorfleet.federated.aggregators.parts import (
    Aggregate,
    AggregationError,
    Aggregator,
    AggregatorPart,
    ClientUpdates,
    RoundContext,
)

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


class Capture(AggregatorPart):
    """A user's own host aggregator: the example-weighted mean in NumPy; keeps what it received."""

    host = True

    def __init__(self, fail_in_round=None):
        self.seen, self.fail_in_round = [], fail_in_round

    def aggregate(self, state, updates, ctx):
        self.seen.append(updates)
        if ctx.round_num == self.fail_in_round:
            raise AggregationError(f"round {ctx.round_num}: too few clients left")
        return Aggregate(updates.values.sum(0) / updates.weights.sum(), state, {"clients": len(updates.client_ids)})


class SignMean(AggregatorPart):
    """A user's own graph aggregator with state: 0.01 times the mean of the updates' signs; counts its rounds."""

    rows = True

    def initial_state(self):
        return {"rounds": np.float32(0)}

    def client(self, update, weight, state, ctx):
        import tensorflow as tf

        return tf.sign(update), self.no_aux(update)

    def aggregate(self, state, updates, ctx):
        import tensorflow as tf

        count = tf.cast(updates.participants, tf.float32)
        done = state["rounds"] + 1
        return Aggregate(0.01 * tf.reduce_sum(updates.values, 0) / count, {"rounds": done}, {"rounds": done})


CAPTURED: dict[str, Capture] = {}


def _capture(clients_per_round, seed, fail_in_round):
    CAPTURED["last"] = Capture(None if fail_in_round < 0 else fail_in_round)
    return CAPTURED["last"]


AGGREGATORS.register("test_capture_mean", Aggregator(compiled=_capture, defaults={"fail_in_round": -1}),
                     description="A test's weighted mean in NumPy.", override=True)
AGGREGATORS.register("test_sign_mean", Aggregator(compiled=lambda clients_per_round, seed: SignMean()),
                     description="A test's sign mean.", override=True)


@pytest.fixture(scope="module")
def setup(digits_flat):
    clients = partition(digits_flat.x_train[:300], digits_flat.y_train[:300], num_clients=6, scheme="quantity:1.0",
                        seed=1)
    initial = models.build("digits_mlp", hidden=8).get_weights()

    def model_fn():
        model = models.build("digits_mlp", hidden=8)
        model.set_weights(initial)
        return model

    return clients, model_fn, np.concatenate([w.ravel() for w in initial])


def _sim(setup, algorithm="fedavg", **options):
    clients, model_fn, _ = setup
    options = {"rounds": 1, "clients_per_round": 3, "seed": 2, "progress": False, "backend": "compiled", **options}
    return Simulation(model_fn, clients, algorithm, **options)


def _flat(sim):
    return np.concatenate([w.ravel() for w in sim.final_weights()])


def test_a_users_host_aggregator_runs_on_compiled_and_equals_numpy_and_the_built_in_mean(setup):
    sim = _sim(setup, aggregator="test_capture_mean")
    history = sim.run()
    seen = CAPTURED["last"].seen[0]
    who = sim.sample(1)["participants"]
    assert seen.client_ids == tuple(who) and seen.participants == 3 and seen.values.shape == (3, setup[2].size)
    assert seen.weights.tolist() == [len(sim.clients.indices(c)) for c in who]  # examples, one epoch
    expected = setup[2] - seen.values.astype(np.float64).sum(0) / seen.weights.sum()  # server SGD, lr 1
    np.testing.assert_allclose(_flat(sim), expected, rtol=0, atol=1e-6)
    assert history.rounds[0]["aggregator_clients"] == 3.0
    built_in = _sim(setup)
    built_in.run()
    np.testing.assert_allclose(_flat(built_in), _flat(sim), rtol=0, atol=1e-6)  # the same sums in another order


def test_a_failing_aggregation_leaves_the_model_as_it_was(setup):
    sim = _sim(setup, aggregator="test_capture_mean", aggregator_options={"fail_in_round": 2}, rounds=3)
    with pytest.raises(AggregationError, match="round 2: too few clients left"):
        sim.run()
    first = CAPTURED["last"].seen[0]
    expected = setup[2] - first.values.astype(np.float64).sum(0) / first.weights.sum()
    after = np.concatenate([w.ravel() for w in sim.model_weights().trainable])
    np.testing.assert_allclose(after, expected, rtol=0, atol=1e-6)
    assert [r["round"] for r in sim.history.rounds] == [1]


def test_a_users_graph_aggregator_with_state_runs_on_compiled(setup, tmp_path):
    sim = _sim(setup, aggregator="test_sign_mean", rounds=2, out_dir=tmp_path, checkpoint_every=1, tensorboard=False)
    history = sim.run()
    assert [r["aggregator_rounds"] for r in history.rounds] == [1.0, 2.0]
    assert sim.rounds.state_leaves()[-1] == 2.0  # the part's state, checkpointed after the model's
    # Each round moves every weight by 0.01 * (a sum of 3 signs) / 3: 100 * 3 * the move is an integer in [-6, 6].
    steps = (setup[2] - _flat(sim)) * 300
    assert np.abs(steps - np.round(steps)).max() < 2e-3 and np.abs(steps).max() <= 6 + 1e-3


def _context(sizes, clients=4):
    return RoundContext(round_num=3, seed=5, clients_per_round=clients, sizes=tuple(sizes))


def test_the_built_in_parts_equal_the_numpy_rules():
    import tensorflow as tf

    from tensorfleet.federated.aggregators.builtin import CompressionPart, DPPart, MeanPart, RobustPart

    rng = np.random.default_rng(0)
    u = rng.normal(size=(4, 12)).astype(np.float32)
    w = np.array([3.0, 1.0, 2.0, 5.0], np.float32)
    ctx = _context([8, 4])
    mean = MeanPart().aggregate({}, ClientUpdates(tf.constant((w[:, None] * u).sum(0)), None, tf.constant(w.sum()),
                                                  4), ctx)
    np.testing.assert_allclose(mean.update.numpy(), (w[:, None] * u).sum(0) / w.sum(), rtol=1e-6, atol=1e-6)

    dp = DPPart(clip=1.5, noise_multiplier=0.0, clients_per_round=4, adaptive=(0.5, 0.2))
    state = {k: tf.constant(v) for k, v in dp.initial_state().items()}
    outs = [dp.client(tf.constant(row), 1.0, state, ctx) for row in u]
    total, unclipped = tf.add_n([o[0] for o in outs]), tf.add_n([o[1] for o in outs])
    result = dp.aggregate(state, ClientUpdates(total, unclipped, None, 4), ctx)
    clipped = np.stack([agg.clip_by_l2_norm(row.astype(np.float64), 1.5) for row in u])
    np.testing.assert_allclose(result.update.numpy(), clipped.sum(0) / 4, rtol=0, atol=1e-6)
    below = np.mean(np.linalg.norm(u, axis=1) <= 1.5)  # TFF's geometric clip update, noise 0
    assert float(result.state["clip"]) == pytest.approx(1.5 * np.exp(-0.2 * (below - 0.5)), rel=1e-6)

    values = w[:, None] * u
    compressed = CompressionPart(bits=4, sparsity=0.5).aggregate(
        {}, ClientUpdates(tf.constant(values), None, tf.constant(w), 4), ctx).update.numpy()
    reference = sum(np.concatenate([agg.quantize(agg.sparsify(p, 0.5), 4) for p in np.split(row, [8])])
                    for row in values.astype(np.float64)) / w.sum()
    np.testing.assert_allclose(compressed, reference, rtol=0, atol=1e-5)

    padded = np.concatenate([u[:3], np.zeros((1, 12), np.float32)])  # 3 participants, one empty slot
    for rule, options, numpy_rule in (("median", {}, agg.coordinate_median),
                                      ("trimmed_mean", {"beta": 0.34}, lambda r: agg.trimmed_mean(r, 0.34)),
                                      ("krum", {"num_byzantine": 0, "num_selected": 2}, lambda r: agg.krum(r, 0, 2))):
        ours = RobustPart(rule, **options).aggregate({}, ClientUpdates(tf.constant(padded), None, None, 3), ctx)
        np.testing.assert_allclose(ours.update.numpy(), numpy_rule(u[:3].astype(np.float64)), rtol=0, atol=1e-6)


def test_fednova_divides_each_update_by_its_steps_and_scales_by_their_weighted_mean(setup):
    runs = {}
    for algorithm in ("fedavg", "fednova"):
        sim = _sim(setup, algorithm, aggregator="test_capture_mean", local_epochs=2)
        sim.run()
        runs[algorithm] = (sim, CAPTURED["last"].seen[0])
    sim, nova = runs["fednova"]
    fedavg = runs["fedavg"][1]
    examples = nova.weights.astype(np.float64)  # examples times epochs
    steps = np.ceil(examples / 20)  # local steps of batch 20
    np.testing.assert_allclose(nova.values, fedavg.values / steps[:, None], rtol=1e-5, atol=1e-6)
    tau_eff = (examples * steps).sum() / examples.sum()
    expected = setup[2] - tau_eff * nova.values.astype(np.float64).sum(0) / examples.sum()
    np.testing.assert_allclose(_flat(sim), expected, rtol=0, atol=1e-5)


def test_stragglers_partial_work_is_weighted_by_the_examples_it_reached(setup):
    options = {"local_epochs": 3, "straggler_share": 0.5, "clients_per_round": 4, "rounds": 2}
    partial = _sim(setup, aggregator="test_capture_mean", straggler_policy="partial", **options)
    dropped = _sim(setup, straggler_policy="drop", **options)
    for r in (1, 2):
        who, gone = partial.sample(r), dropped.sample(r)
        assert who["stragglers"] == gone["stragglers"] and set(who["work"]) == set(who["stragglers"])
        assert gone["participants"] == [c for c in who["sampled"] if c not in who["stragglers"]]
        for c, examples in who["work"].items():
            n = len(partial.clients.indices(c))
            assert examples % n == 0 and 1 <= examples // n <= 3  # whole epochs in [1, local_epochs]
    assert any(partial.sample(r)["stragglers"] for r in (1, 2))
    history = partial.run()
    for r, seen in zip((1, 2), CAPTURED["last"].seen):
        who = partial.sample(r)
        full = {c: 3 * len(partial.clients.indices(c)) for c in who["participants"]}
        expected = [who["work"].get(c, full[c]) for c in who["participants"]]
        assert seen.weights.tolist() == expected and history.rounds[r - 1]["num_examples"] == sum(expected)
    assert dropped.run().rounds[0]["participants"] == len(dropped.sample(1)["participants"])


def test_batch_normalization_statistics_are_the_clients_mean_weighted_by_examples(setup):

    def bn_model():
        tf_keras.utils.set_random_seed(0)
        return tf_keras.Sequential([tf_keras.layers.BatchNormalization(input_shape=(64,)),
                                    tf_keras.layers.Dense(10)])

    clients = setup[0]
    finals = {}
    for mode in ("mean", "initial"):
        sim = Simulation(bn_model, clients, rounds=1, clients_per_round=3, seed=2, progress=False,
                         backend="compiled", batch_size=20, non_trainable=mode)
        sim.run()
        finals[mode] = sim.model_weights().non_trainable
    moving = {}
    for c in sim.sample(1)["participants"]:
        x, _ = sim.sampler.client_arrays(c, 1)
        mean, var = np.zeros(64), np.ones(64)
        for start in range(0, len(x), 20):  # Keras's moving averages, momentum 0.99, over the client's batches
            batch = x[start:start + 20].astype(np.float64)
            mean, var = 0.99 * mean + 0.01 * batch.mean(0), 0.99 * var + 0.01 * batch.var(0)
        moving[c] = (len(x), mean, var)
    total = sum(n for n, _, _ in moving.values())
    for i in (0, 1):
        expected = sum(n * stats[i] for n, *stats in moving.values()) / total
        np.testing.assert_allclose(finals["mean"][i], expected, rtol=0, atol=2e-5)
    assert finals["initial"][0].tolist() == [0.0] * 64 and finals["initial"][1].tolist() == [1.0] * 64
