"""A Keras 3 model or layer (the ``keras`` package, installed beside tf_keras on the current track) is taken by the
strategies' entry points in its own Keras; one block of layers from both Kerases is one clear error. (How they
train: tests/strategies/test_keras3_strategies.py and test_memory_savers.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from tensorfleet.compat.keras import keras2
from tensorfleet.strategies import memory_savers

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


def test_accumulate_gradients_takes_a_keras3_model_and_returns_one(keras3: Any) -> None:
    model = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)])
    accumulating = memory_savers.accumulate_gradients(model, steps=2)
    assert isinstance(accumulating, keras3.Model) and accumulating.name == f"{model.name}_accumulate2"
    assert accumulating.count_params() == 10 and accumulating.layers[-1] is model.layers[-1]


def test_recompute_takes_keras3_layers_and_is_a_keras3_layer(keras3: Any) -> None:
    block = memory_savers.recompute([keras3.layers.Dense(3), keras3.layers.Dense(2)], name="block")
    model = keras3.Sequential([keras3.Input((4,)), block])
    assert isinstance(block, keras3.layers.Layer) and model.output_shape == (None, 2)
    assert model.count_params() == 4 * 3 + 3 + 3 * 2 + 2


def test_recompute_refuses_layers_of_both_kerases_in_one_block(keras3: Any) -> None:

    with pytest.raises(TypeError, match=r"^recompute takes layers of one Keras: all Keras 3 \(import keras\) or all "
                                        r"tf_keras \(import tf_keras\)\. Received: two \(keras2\), three \(keras3\)$"):
        memory_savers.recompute([tf_keras.layers.Dense(2, name="two"), keras3.layers.Dense(2, name="three")])


def test_recompute_and_accumulate_refuse_what_is_not_keras(keras3: Any) -> None:
    with pytest.raises(TypeError, match=r"^recompute takes a Keras layer \(Keras 3 or tf_keras\)\. Received: layer of "
                                        r"type int$"):
        memory_savers.recompute([keras3.layers.Dense(2), 3])
    with pytest.raises(TypeError, match=r"^accumulate_gradients needs a built functional or sequential Keras model\. "
                                        r"Received: Dense$"):
        memory_savers.accumulate_gradients(keras3.layers.Dense(2), steps=2)


@pytest.mark.parametrize("entry", ["fit_inputs", "evaluate_inputs"])
def test_fit_and_evaluate_inputs_take_a_keras3_model_as_the_strategy(keras3: Any, entry: str) -> None:
    import numpy as np
    import tensorflow as tf

    import tensorfleet as tfl

    model = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)])
    inputs = getattr(tfl.strategies, entry)(np.zeros((8, 4), np.float32), np.zeros(8, np.int64), batch_size=4,
                                            strategy=model)
    assert isinstance(inputs["x"], tf.data.Dataset)
    assert [tuple(x.shape) for x, _ in inputs["x"]] == [(4, 4), (4, 4)]


def test_a_tf_keras_model_is_still_taken() -> None:

    model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(2)])
    accumulating = memory_savers.accumulate_gradients(model, steps=2)
    assert accumulating.count_params() == 10 and isinstance(accumulating, tf_keras.Model)
