"""FedBN (``non_trainable="per_client"``) on the compiled backend against a NumPy reference of the rule:
local SGD through BatchNormalization written out in NumPy, the shared weights averaged by examples, each
client's BatchNormalization layers kept from round to round; per-client evaluation; checkpoint and resume;
the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from tensorfleet.compat.keras import keras2
from tensorfleet.federated import Simulation, partition
from tensorfleet.federated.checkpoint import PREVIOUS_FILE
from tensorfleet.federated.config import SimulationConfig

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

EPS, MOMENTUM, LR = 1e-3, 0.99, 0.1  # Keras's BatchNormalization defaults, FedAvg's client SGD


def bn_model():

    tf_keras.utils.set_random_seed(3)
    return tf_keras.Sequential([tf_keras.layers.Dense(3, input_shape=(4,)), tf_keras.layers.BatchNormalization(),
                                tf_keras.layers.Dense(2)])


def make_clients():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4)).astype(np.float32)
    x[:20] = 3.0 * x[:20] + 1.0  # two kinds of features: what FedBN is for
    return partition(x, (x[:, 0] > 0.5).astype(np.int64), num_clients=4, scheme="iid", seed=1)


def simulation(**options):
    return Simulation(bn_model, make_clients(), "fedavg", backend="compiled", clients_per_round=2, seed=2,
                      batch_size=4, progress=False, non_trainable="per_client", **options)


def local_sgd(params, x, y):
    """Keras's training steps of the model (Dense, BatchNormalization, Dense; cross-entropy from logits)
    on ``x, y`` in batches of 4, in float64: ``params`` W1 b1 gamma beta W2 b2 moving_mean moving_var."""
    W1, b1, g, be, W2, b2, mm, mv = (np.array(p, np.float64) for p in params)
    for s in range(0, len(y), 4):
        xb, yb = x[s:s + 4].astype(np.float64), y[s:s + 4]
        n = len(yb)
        h = xb @ W1 + b1
        mu, var = h.mean(0), h.var(0)
        inv = 1.0 / np.sqrt(var + EPS)
        xhat = (h - mu) * inv
        z = g * xhat + be
        logits = z @ W2 + b2
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        dlog = (p - np.eye(2)[yb]) / n
        dz = dlog @ W2.T
        dxhat = dz * g
        dh = inv / n * (n * dxhat - dxhat.sum(0) - xhat * (dxhat * xhat).sum(0))
        grads = [xb.T @ dh, dh.sum(0), (dz * xhat).sum(0), dz.sum(0), z.T @ dlog, dlog.sum(0)]
        W1, b1, g, be, W2, b2 = (w - LR * d for w, d in zip((W1, b1, g, be, W2, b2), grads))
        mm, mv = MOMENTUM * mm + (1 - MOMENTUM) * mu, MOMENTUM * mv + (1 - MOMENTUM) * var
    return [W1, b1, g, be, W2, b2, mm, mv]


BN = (2, 3, 6, 7)  # gamma, beta, moving mean, moving variance: the client's own


def reference(sim, rounds):
    """FedBN's rule in NumPy: ``(server params, {client: its BN params})`` after ``rounds``."""
    model = bn_model()
    server = [np.asarray(w, np.float64) for w in model.trainable_weights + model.non_trainable_weights]
    own = {}
    for r in range(1, rounds + 1):
        ends, counts = [], []
        for c in sim.sample(r)["participants"]:
            start = [own[c][BN.index(i)] if c in own and i in BN else w for i, w in enumerate(server)]
            x, y = sim.sampler.client_arrays(c, r)
            end = local_sgd(start, x, y)
            own[c] = [end[i] for i in BN]
            ends.append(end)
            counts.append(len(y))
        # Shared weights: the server minus the mean delta (SGD at 1.0), the BN layers the participants' mean.
        server = [sum(n * e[i] for n, e in zip(counts, ends)) / sum(counts) for i in range(len(server))]
    return server, own


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory):
    out = tmp_path_factory.mktemp("fedbn")
    sim = simulation(rounds=2, out_dir=out / "run", checkpoint_every=1, tensorboard=False)
    sim.run()
    return sim, out


def test_fedbn_matches_the_numpy_rule_and_keeps_state_for_sampled_clients_only(two_rounds):
    sim, _ = two_rounds
    server, own = reference(sim, 2)
    sampled = [set(sim.sample(r)["participants"]) for r in (1, 2)]
    assert sampled[0] & sampled[1] and sampled[0] | sampled[1] != set(sim.train_ids)  # the test has power
    engine = sim.rounds.engine
    assert sorted(engine.local_states) == sorted(sampled[0] | sampled[1])  # only sampled clients hold state
    weights = sim.model_weights()
    for got, want in zip(weights.trainable + weights.non_trainable, server):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for c, params in own.items():
        client, own_bn = sim.rounds.client_weights(c)
        assert own_bn
        got = client.trainable + client.non_trainable
        for i, want in zip(BN, params):
            np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)
        for i in (0, 1, 4, 5):  # shared: the server's
            np.testing.assert_array_equal(got[i], weights.trainable[i])
    # A client in both rounds started round 2 from its own layers, not the server's: they differ.
    both = sorted(sampled[0] & sampled[1])[0]
    assert not np.allclose(own[both][0], server[2])
    assert "participants' BatchNormalization" in sim.history.config["global_bn"]
    # What a client uploads: the shared weights' float32 values, not its BN layers'.
    shared = sum(int(np.prod(np.shape(server[i]))) for i in (0, 1, 4, 5))
    assert [r["upload_bytes"] for r in sim.history.rounds] == [4 * shared * r["participants"]
                                                               for r in sim.history.rounds]


def test_each_client_is_evaluated_with_its_own_batch_normalization(two_rounds):
    sim, _ = two_rounds
    server, own = reference(sim, 2)
    data = {c: sim.clients.arrays(c) for c in sim.train_ids}
    results = sim.evaluate_clients(data)
    for c, (x, y) in data.items():
        params = [own[c][BN.index(i)] if c in own and i in BN else w for i, w in enumerate(server)]
        W1, b1, g, be, W2, b2, mm, mv = params
        logits = (g * (x @ W1 + b1 - mm) / np.sqrt(mv + EPS) + be) @ W2 + b2
        logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        assert results[c]["own_bn"] is (c in own)
        assert results[c]["test_accuracy"] == np.mean(np.argmax(logits, 1) == y)
        assert results[c]["test_loss"] == pytest.approx(-np.mean(logp[np.arange(len(y)), y]), rel=1e-5)


def test_per_client_state_survives_checkpoint_and_resume(two_rounds, tmp_path):
    import shutil

    sim, out = two_rounds
    assert (out / "run" / PREVIOUS_FILE).is_file()  # round 1's generation, kept beside round 2's
    first = tmp_path / "resumed"
    simulation(rounds=1, out_dir=first, checkpoint_every=1, tensorboard=False).run()
    resumed = simulation(rounds=2, out_dir=first, checkpoint_every=1, tensorboard=False)
    history = resumed.run()
    assert [r["round"] for r in history.rounds] == [1, 2] and len(resumed.history.rounds) == 2
    a, b = sim.rounds.engine.local_states, resumed.rounds.engine.local_states
    assert sorted(a) == sorted(b)
    for c in a:
        np.testing.assert_allclose(a[c], b[c], rtol=1e-6, atol=1e-6)
    for got, want in zip(resumed.final_weights(), sim.final_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    shutil.rmtree(first)


def test_fedbn_is_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match=r"^non_trainable='per_client' \(FedBN.*runs on backend='compiled' only.*"
                                         r"Received: non_trainable='per_client' with backend='tff'"):
        SimulationConfig(non_trainable="per_client", backend="tff")
    with pytest.raises(ValueError, match=r"Received: non_trainable='per_client' with algorithm='fedsgd'"):
        SimulationConfig(algorithm="fedsgd", non_trainable="per_client")
    with pytest.raises(ValueError, match=r"non_trainable must be one of 'mean', 'initial', 'per_client'\. "
                                         r"Received: non_trainable='fedbn'"):
        SimulationConfig(non_trainable="fedbn")


def test_a_model_without_batch_normalization_keeps_nothing_per_client():

    def dense():
        tf_keras.utils.set_random_seed(3)
        return tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(4,))])

    sim = Simulation(dense, make_clients(), "fedavg", backend="compiled", clients_per_round=2, seed=2, batch_size=4,
                     progress=False, non_trainable="per_client", rounds=1)
    sim.run()
    assert sim.rounds.engine.local_states == {} and sim.rounds.client_weights("client_000")[1] is False
    # kernel, bias and the server SGD's learning rate: no per-client leaves
    assert len(sim.rounds.state_leaves()) == 3 and sim.rounds.ragged_leaves == ()
