"""Megatron tensor-parallel layers equal their unsplit Keras layers (forward and gradients)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet import models
from tensorfleet.compat.keras import keras2
from tensorfleet.model_parallel import tensor_parallel as tp

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

TOL = 1e-5


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.fixture(params=[2, 4], ids=["N2", "N4"])
def devices(request, logical_cpus):
    return logical_cpus[: request.param]


def test_column_parallel_dense_matches_dense(devices):
    dense = tf_keras.layers.Dense(8, activation="tanh", kernel_initializer=tf_keras.initializers.GlorotUniform(1),
                                  bias_initializer=tf_keras.initializers.RandomNormal(seed=2))
    x = tf.random.stateless_normal((5, 6), seed=(1, 2))
    dense(x)
    layer = tp.ColumnParallelDense.from_dense(dense, devices=devices, gather_output=True)
    assert len(layer.kernels) == len(devices)
    assert layer.kernels[-1].shape == (6, 8 // len(devices))
    assert layer.kernels[-1].device.endswith(devices[-1].split("device:")[-1])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y_ref, y_tp = dense(x), layer(x)
        l_ref, l_tp = tf.reduce_sum(y_ref ** 2), tf.reduce_sum(y_tp ** 2)
    assert _max_diff(y_ref, y_tp) < TOL
    assert _max_diff(tape.gradient(l_ref, x), tape.gradient(l_tp, x)) < TOL
    assert _max_diff(tape.gradient(l_ref, dense.kernel),
                     np.concatenate(tape.gradient(l_tp, layer.kernels), axis=1)) < TOL
    assert _max_diff(tape.gradient(l_ref, dense.bias), np.concatenate(tape.gradient(l_tp, layer.biases))) < TOL


def test_row_parallel_dense_matches_dense(devices):
    dense = tf_keras.layers.Dense(3, activation="sigmoid", kernel_initializer=tf_keras.initializers.GlorotUniform(3),
                                  bias_initializer=tf_keras.initializers.RandomNormal(seed=4))
    x = tf.random.stateless_normal((4, 8), seed=(3, 4))
    dense(x)
    layer = tp.RowParallelDense.from_dense(dense, devices=devices)
    assert layer.kernels[0].shape == (8 // len(devices), 3)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        l_ref, l_tp = tf.reduce_sum(dense(x) ** 2), tf.reduce_sum(layer(x) ** 2)
    assert _max_diff(l_ref, l_tp) < TOL
    assert _max_diff(tape.gradient(l_ref, x), tape.gradient(l_tp, x)) < TOL
    assert _max_diff(tape.gradient(l_ref, dense.kernel),
                     np.concatenate(tape.gradient(l_tp, layer.kernels), axis=0)) < TOL
    assert _max_diff(tape.gradient(l_ref, dense.bias), tape.gradient(l_tp, layer.bias)) < TOL


def test_parallel_mlp_matches_two_dense_layers(devices):
    first = tf_keras.layers.Dense(16, activation="relu", kernel_initializer=tf_keras.initializers.GlorotUniform(5),
                                  bias_initializer=tf_keras.initializers.RandomNormal(seed=6))
    second = tf_keras.layers.Dense(5, kernel_initializer=tf_keras.initializers.GlorotUniform(7))
    x = tf.random.stateless_normal((6, 10), seed=(5, 6))
    second(first(x))
    mlp = tp.ParallelMLP.from_dense(first, second, devices=devices)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y_ref, y_tp = second(first(x)), mlp(x)
        l_ref, l_tp = tf.reduce_sum(tf.sin(y_ref)), tf.reduce_sum(tf.sin(y_tp))
    assert _max_diff(y_ref, y_tp) < TOL
    assert _max_diff(tape.gradient(l_ref, x), tape.gradient(l_tp, x)) < TOL
    assert _max_diff(tape.gradient(l_ref, first.kernel),
                     np.concatenate(tape.gradient(l_tp, mlp.column.kernels), axis=1)) < TOL
    assert _max_diff(tape.gradient(l_ref, second.kernel),
                     np.concatenate(tape.gradient(l_tp, mlp.row.kernels), axis=0)) < TOL


def test_parallel_attention_matches_multi_head_attention(devices):
    mha = tf_keras.layers.MultiHeadAttention(4, 3, kernel_initializer=tf_keras.initializers.GlorotUniform(8),
                                             bias_initializer=tf_keras.initializers.RandomNormal(seed=9))
    x = tf.random.stateless_normal((2, 5, 12), seed=(7, 8))
    mha(x, x)
    attention = tp.ParallelSelfAttention.from_keras(mha, devices=devices)
    assert attention.shard_heads == 4 // len(devices)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y_ref, y_tp = mha(x, x), attention(x)
        l_ref, l_tp = tf.reduce_sum(tf.sin(y_ref)), tf.reduce_sum(tf.sin(y_tp))
    assert _max_diff(y_ref, y_tp) < TOL
    assert _max_diff(tape.gradient(l_ref, x), tape.gradient(l_tp, x)) < TOL
    for name, dense in (("query", mha._query_dense), ("value", mha._value_dense)):
        grads = tape.gradient(l_tp, [s[f"{name}_kernel"] for s in attention.shards])
        assert _max_diff(tape.gradient(l_ref, dense.kernel), np.concatenate(grads, axis=1)) < TOL
    grads = tape.gradient(l_tp, [s["output_kernel"] for s in attention.shards])
    assert _max_diff(tape.gradient(l_ref, mha._output_dense.kernel), np.concatenate(grads, axis=0)) < TOL


def test_parallel_transformer_block_matches_model_block(devices):
    model = models.build("transformer_block", keras="tf_keras")
    block = model.get_layer("block")
    x = tf.random.stateless_normal((3, 8, 16), seed=(9, 10))
    parallel = tp.ParallelTransformerBlock.from_block(block, devices=devices)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        l_ref, l_tp = tf.reduce_sum(block(x) ** 2), tf.reduce_sum(parallel(x) ** 2)
    assert abs(float(l_ref) - float(l_tp)) / abs(float(l_ref)) < TOL
    assert _max_diff(tape.gradient(l_ref, x),
                     tape.gradient(l_tp, x)) < 1e-4 * float(tf.reduce_max(tf.abs(tape.gradient(l_ref, x))))
    assert _max_diff(tape.gradient(l_ref, block.dense1.kernel),
                     np.concatenate(tape.gradient(l_tp, parallel.mlp.column.kernels), axis=1)) < 1e-4


def test_units_not_divisible_by_devices_is_a_clear_error(logical_cpus):
    with pytest.raises(ValueError, match=r"units=6 cannot be split evenly over 4 devices"):
        tp.ColumnParallelDense(6, devices=logical_cpus[:4])
    with pytest.raises(ValueError, match=r"num_heads=3 cannot be split evenly over 2 devices"):
        tp.ParallelSelfAttention(3, 4, devices=logical_cpus[:2])


def test_bad_devices_and_units_are_clear_errors():
    with pytest.raises(ValueError, match=r"devices must be a non-empty list .* Received: devices=\[\]"):
        tp.ColumnParallelDense(4, devices=[])
    with pytest.raises(ValueError, match=r"units must be a positive integer. Received: units=0"):
        tp.RowParallelDense(0, devices=["/CPU:0"])
    unbuilt = tf_keras.layers.Dense(4)
    with pytest.raises(ValueError, match=r"must be built"):
        tp.ColumnParallelDense.from_dense(unbuilt, devices=["/CPU:0"])


def test_fresh_layer_shards_are_cut_from_one_draw(logical_cpus):
    layer = tp.ColumnParallelDense(8, devices=logical_cpus[:2],
                                   kernel_initializer=tf_keras.initializers.GlorotUniform(seed=3))
    layer.build((None, 5))
    expected = tf_keras.initializers.GlorotUniform(seed=3)((5, 8)).numpy()
    np.testing.assert_array_equal(np.concatenate([k.numpy() for k in layer.kernels], axis=1), expected)
    assert not np.array_equal(layer.kernels[0].numpy(), layer.kernels[1].numpy())
