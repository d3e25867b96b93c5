"""FedProx follows the paper: local steps on f_k(w) + mu/2 ||w - w_server||^2 (Li et al., MLSys 2020)."""

from __future__ import annotations

import numpy as np
import pytest

from tensorfleet.compat.keras import keras2
from tensorfleet.federated import algorithms
from tensorfleet.federated.backends.tff import managed_context

pytestmark = pytest.mark.tff  # FedProx on TFF's process against TFF's own builder

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

KERNEL, BIAS = np.array([[0.5], [-0.25], [1.0]]), np.array([0.1])
MU, LR, BATCH, EPOCHS = 0.5, 0.1, 4, 2


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [2.0], [-1.0]]) + 0.3).astype(np.float32)
    return x, y


def _model_fn():
    import tensorflow as tf
    import tensorflow_federated as tff

    model = tf_keras.Sequential([tf_keras.layers.Dense(
        1, input_shape=(3,), kernel_initializer=tf_keras.initializers.Constant(KERNEL),
        bias_initializer=tf_keras.initializers.Constant(BIAS))])
    return tff.learning.models.from_keras_model(
        model, input_spec=(tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 1], tf.float32)),
        loss=tf_keras.losses.MeanSquaredError())


def _local_training(sign: float, momentum: float | None) -> list[np.ndarray]:
    """The client's weights after its local steps, in float64; ``sign`` +1 is the paper's proximal
    gradient ``mu * (w - w_server)``, -1 TFF 0.87's ``mu * (w_server - w)``."""
    x, y = (a.astype(np.float64) for a in _data())
    start = [KERNEL.copy(), BIAS.copy()]
    w, velocity = [a.copy() for a in start], [np.zeros_like(a) for a in start]
    for _ in range(EPOCHS):
        for s in range(0, len(x), BATCH):
            xb, yb = x[s:s + BATCH], y[s:s + BATCH]
            residual = xb @ w[0] + w[1] - yb  # mean squared error: gradient 2/B * X^T r
            grads = [2 * xb.T @ residual / len(xb), 2 * residual.mean(axis=0)]
            grads = [g + sign * MU * (a - a0) for g, a, a0 in zip(grads, w, start)]
            if momentum is None:
                w = [a - LR * g for a, g in zip(w, grads)]
            else:
                velocity = [momentum * v + g for v, g in zip(velocity, grads)]
                w = [a - LR * v for a, v in zip(w, velocity)]
    return w


def _one_round(process) -> list[np.ndarray]:
    import tensorflow as tf

    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(EPOCHS)
    with managed_context():
        state = process.next(process.initialize(), [dataset]).state
        return [np.asarray(w) for w in process.get_model_weights(state).trainable]


@pytest.mark.parametrize("client_optimizer,momentum", [("sgd", None), ("sgdm", 0.9)])
def test_fedprox_steps_on_the_papers_proximal_gradient_and_tffs_builder_on_the_opposite(client_optimizer, momentum):
    import tensorflow_federated as tff

    # One client, server SGD of lr 1: the new global model is the client's model after its 6 steps.
    options = {} if momentum is None else {"momentum": momentum}
    ours = _one_round(algorithms.build_process("fedprox", _model_fn, client_optimizer=client_optimizer,
                                               client_learning_rate=LR, mu=MU))
    theirs = _one_round(tff.learning.algorithms.build_weighted_fed_prox(
        _model_fn, proximal_strength=MU, client_optimizer_fn=tff.learning.optimizers.build_sgdm(LR, **options),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0)))
    paper, tff_sign = _local_training(+1.0, momentum), _local_training(-1.0, momentum)
    for got, want in zip(ours, paper):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    for got, want in zip(theirs, tff_sign):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # The signs give models apart by far more than the tolerance.
    assert max(np.max(np.abs(a - b)) for a, b in zip(paper, tff_sign)) > 1e-2


def test_fedprox_with_an_unweighted_aggregator_steps_on_the_papers_gradient_too():
    import tensorflow_federated as tff

    process = algorithms.build_process("fedprox", _model_fn, client_learning_rate=LR, mu=MU,
                                       aggregator=tff.aggregators.UnweightedMeanFactory())
    for got, want in zip(_one_round(process), _local_training(+1.0, None)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_negative_mu_is_refused():
    with pytest.raises(ValueError, match=r"^mu must be a finite number >= 0. Received: mu=-0.1$"):
        algorithms.build_process("fedprox", _model_fn, mu=-0.1)
