"""The memory savers: gradient accumulation, recomputation and mixed precision train as promised."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet.compat.keras import keras2
from tensorfleet.models import build
from tensorfleet.strategies import memory_savers

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


def _data(n: int = 32):
    rng = np.random.default_rng(1)
    return rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


def test_gradient_accumulation_equals_one_big_batch_with_sgd():
    x, y = _data(32)
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    big = build("digits_mlp", input_dim=64, seed=3, keras="tf_keras")
    big.compile(optimizer=tf_keras.optimizers.SGD(0.5), loss=loss)
    big.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    acc = memory_savers.accumulate_gradients(build("digits_mlp", input_dim=64, seed=3, keras="tf_keras"), steps=4)
    acc.compile(optimizer=tf_keras.optimizers.SGD(0.5), loss=loss)
    acc.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert acc.optimizer.iterations.numpy() == 2  # one update per batch of 4 micro-batches
    for a, b in zip(big.get_weights(), acc.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="steps must be a positive integer. Received: steps=0"):
        memory_savers.accumulate_gradients(big, 0)


def test_recomputed_block_gives_the_same_gradients():
    x, y = _data(16)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def make(recompute: bool) -> tf_keras.Model:
        layers = [tf_keras.layers.Dense(32, activation="tanh",
                                        kernel_initializer=tf_keras.initializers.GlorotUniform(k))
                  for k in (1, 2)]
        inputs = tf_keras.Input(shape=(64,))
        h = memory_savers.recompute(layers)(inputs) if recompute else layers[1](layers[0](inputs))
        outputs = tf_keras.layers.Dense(10, kernel_initializer=tf_keras.initializers.GlorotUniform(3))(h)
        return tf_keras.Model(inputs, outputs)

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
    before = tf_keras.mixed_precision.global_policy().name
    with memory_savers.mixed_precision("mixed_float16") as wrap:
        model = build("digits_mlp")
        optimizer = wrap(tf_keras.optimizers.Adam())
    assert tf_keras.mixed_precision.global_policy().name == before
    assert model.layers[1].compute_dtype == "float16" and model.layers[1].dtype == "float32"
    assert isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer) and optimizer.dynamic
    with memory_savers.mixed_precision("mixed_bfloat16") as wrap:
        assert isinstance(wrap(tf_keras.optimizers.SGD()), tf_keras.optimizers.SGD)


# --------------------------------------------------------------------------- Keras 3 models


def _keras3_mlp(keras3, *, block=None):
    """A Keras 3 MLP whose two hidden layers are plain, or the layers of ``block(layers)``."""
    init = keras3.initializers.GlorotUniform
    hidden = [keras3.layers.Dense(32, activation="tanh", kernel_initializer=init(seed=k)) for k in (1, 2)]
    inputs = keras3.Input((64,))
    h = block(hidden)(inputs) if block else hidden[1](hidden[0](inputs))
    return keras3.Model(inputs, keras3.layers.Dense(10, kernel_initializer=init(seed=3))(h))


def _fit_keras3(keras3, model, x, y, strategy=None, epochs=2):
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model.compile(optimizer=keras3.optimizers.SGD(0.5), metrics=["accuracy"],
                      loss=keras3.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0).history


def _assert_same_weights(a, b):
    for got, want in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("replicas", [1, 2], ids=["no_strategy", "mirrored2"])
def test_keras3_gradient_accumulation_equals_one_big_batch(keras3, logical_cpus, replicas):
    import tensorfleet as tfl

    x, y = _data(64)
    big = _keras3_mlp(keras3)
    big_history = _fit_keras3(keras3, big, x, y)
    strategy = tfl.strategies.build("mirrored", devices=logical_cpus[:replicas]) if replicas > 1 else None
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        acc = memory_savers.accumulate_gradients(_keras3_mlp(keras3), steps=4)
    assert isinstance(acc, keras3.Model) and acc.count_params() == big.count_params() == 3466
    history = _fit_keras3(keras3, acc, x, y, strategy)
    # 2 epochs of 2 batches of 32, each 4 micro-batches of 8 / replicas
    assert int(acc.optimizer.iterations.numpy()) == 4
    _assert_same_weights(acc, big)
    for key in ("loss", "accuracy"):  # the logged metrics are the whole batch's
        np.testing.assert_allclose(history[key], big_history[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_keras3_recomputed_block_trains_as_the_plain_layers(keras3):
    x, y = _data(64)
    plain, recomputed = _keras3_mlp(keras3), _keras3_mlp(keras3, block=memory_savers.recompute)
    block = recomputed.layers[1]
    assert isinstance(block, keras3.layers.Layer) and len(block.trainable_weights) == 4
    loss_fn = keras3.losses.SparseCategoricalCrossentropy(from_logits=True)
    grads = []
    for model in (plain, recomputed):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads.append([g.numpy() for g in tape.gradient(loss, model.trainable_variables)])
    assert [g.shape for g in grads[0]] == [g.shape for g in grads[1]] and len(grads[0]) == 6
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    histories = [_fit_keras3(keras3, model, x, y) for model in (plain, recomputed)]
    _assert_same_weights(recomputed, plain)
    np.testing.assert_allclose(histories[1]["loss"], histories[0]["loss"], rtol=1e-5, atol=1e-6)


def test_keras3_mixed_precision_sets_the_policy_and_keras3_loss_scaling_then_restores(keras3):
    before = keras3.mixed_precision.global_policy().name
    with memory_savers.mixed_precision("mixed_float16") as wrap:
        model = _keras3_mlp(keras3)
        optimizer = wrap(keras3.optimizers.SGD(0.5))
    assert keras3.mixed_precision.global_policy().name == before == "float32"
    assert (model.layers[1].compute_dtype, model.layers[1].variable_dtype) == ("float16", "float32")
    assert isinstance(optimizer, keras3.mixed_precision.LossScaleOptimizer)
    assert optimizer.dynamic_growth_steps == 2000  # Keras 3 scales dynamically, always
    # Combined with accumulation: the loss is scaled in each micro-batch and the update unscaled once.
    acc = memory_savers.accumulate_gradients(model, steps=2)
    acc.compile(optimizer=optimizer, loss=keras3.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data(64)
    history = acc.fit(x, y, batch_size=32, epochs=3, verbose=0).history
    assert int(acc.optimizer.iterations) == 6 and np.isfinite(history["loss"]).all()
    assert all(np.isfinite(w).all() for w in acc.get_weights())
    with memory_savers.mixed_precision("mixed_bfloat16") as wrap:
        sgd = keras3.optimizers.SGD()
        assert wrap(sgd) is sgd and keras3.Sequential([keras3.layers.Dense(2)]).dtype_policy.name == "mixed_bfloat16"
    with pytest.raises(TypeError, match=r"^mixed_precision's wrap takes a Keras optimizer \(Keras 3 or tf_keras\)\. "
                                        r"Received: optimizer of type str"), \
            memory_savers.mixed_precision("mixed_float16") as wrap:
        wrap("adam")
