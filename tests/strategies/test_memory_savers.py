"""The memory savers: gradient accumulation, recomputation and mixed precision train as promised."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet.models import build
from tensorfleet.strategies import memory_savers


def _data(n: int = 32):
    rng = np.random.default_rng(1)
    return rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


def test_gradient_accumulation_equals_one_big_batch_with_sgd():
    x, y = _data(32)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    big = build("digits_mlp", input_dim=64, seed=3)
    big.compile(optimizer=tf.keras.optimizers.SGD(0.5), loss=loss)
    big.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    acc = memory_savers.accumulate_gradients(build("digits_mlp", input_dim=64, seed=3), steps=4)
    acc.compile(optimizer=tf.keras.optimizers.SGD(0.5), loss=loss)
    acc.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert acc.optimizer.iterations.numpy() == 2  # one update per batch of 4 micro-batches
    for a, b in zip(big.get_weights(), acc.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="steps must be a positive integer. Received: steps=0"):
        memory_savers.accumulate_gradients(big, 0)


def test_recomputed_block_gives_the_same_gradients():
    x, y = _data(16)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def make(recompute: bool) -> tf.keras.Model:
        layers = [tf.keras.layers.Dense(32, activation="tanh", kernel_initializer=tf.keras.initializers.GlorotUniform(k))
                  for k in (1, 2)]
        inputs = tf.keras.Input(shape=(64,))
        h = memory_savers.recompute(layers)(inputs) if recompute else layers[1](layers[0](inputs))
        outputs = tf.keras.layers.Dense(10, kernel_initializer=tf.keras.initializers.GlorotUniform(3))(h)
        return tf.keras.Model(inputs, outputs)

    grads = []
    for flag in (False, True):
        model = make(flag)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads.append([g.numpy() for g in tape.gradient(loss, model.trainable_variables)])
    assert [g.shape for g in grads[0]] == [g.shape for g in grads[1]] and len(grads[0]) == 6
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_mixed_precision_sets_a_policy_and_loss_scaling_then_restores():
    before = tf.keras.mixed_precision.global_policy().name
    with memory_savers.mixed_precision("mixed_float16") as wrap:
        model = build("digits_mlp")
        optimizer = wrap(tf.keras.optimizers.Adam())
    assert tf.keras.mixed_precision.global_policy().name == before
    assert model.layers[1].compute_dtype == "float16" and model.layers[1].dtype == "float32"
    assert isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer) and optimizer.dynamic
    with memory_savers.mixed_precision("mixed_bfloat16") as wrap:
        assert isinstance(wrap(tf.keras.optimizers.SGD()), tf.keras.optimizers.SGD)
