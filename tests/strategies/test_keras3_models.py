"""A Keras 3 model or layer (the ``keras`` package, installed beside tf_keras on the current track) gets one
clear error at the strategies' entry points that take one, naming the entry point and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from tensorfleet.compat.keras import Keras3ModelError
from tensorfleet.strategies import memory_savers

_FIX = r" For Keras 2, build the model with `import tf_keras as keras`"


def test_accumulate_gradients_refuses_a_keras3_model(keras3: Any) -> None:
    model = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)])
    with pytest.raises(Keras3ModelError, match=r"^accumulate_gradients runs Keras 2 \(tf_keras\) models only for now, and received a Keras 3 model \(keras\.src\.models"
                                               r"\.sequential\.Sequential\)\." + _FIX):
        memory_savers.accumulate_gradients(model, steps=2)


def test_recompute_refuses_a_keras3_layer(keras3: Any) -> None:
    import tensorflow as tf

    with pytest.raises(Keras3ModelError, match=r"^recompute runs Keras 2 \(tf_keras\) models only for now, and received a Keras 3 model \(keras\.src\.layers\.core\.dense"
                                               r"\.Dense\)\." + _FIX):
        memory_savers.recompute([tf.keras.layers.Dense(2), keras3.layers.Dense(2)])


@pytest.mark.parametrize("entry", ["fit_inputs", "evaluate_inputs"])
def test_fit_and_evaluate_inputs_refuse_a_keras3_model_as_the_strategy(keras3: Any, entry: str) -> None:
    import numpy as np

    import tensorfleet as tfl

    model = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)])
    with pytest.raises(Keras3ModelError, match=rf"^{entry} runs Keras 2 \(tf_keras\) models only for now, and received a Keras 3 model \(keras\.src\.models\.sequential"
                                               r"\.Sequential\)\." + _FIX):
        getattr(tfl.strategies, entry)(np.zeros((8, 4), np.float32), np.zeros(8, np.int64), strategy=model)


def test_a_tf_keras_model_is_still_taken() -> None:
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    assert memory_savers.accumulate_gradients(model, steps=2).count_params() == 10
