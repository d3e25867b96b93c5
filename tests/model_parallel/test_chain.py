"""A Keras model read as one chain of layers: what mesh layouts and pipeline stages both split."""

from __future__ import annotations

import pytest

from tensorfleet.compat.keras import keras2
from tensorfleet.model_parallel.chain import chain_layers

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

CHAIN_ERROR = (r"Splitting a model across devices needs a model whose layers form one chain \(each layer feeding the "
               r"next\); layer 'add' of model 'branch' does not. Wrap branching parts in one layer.")


def _branching_model() -> tf_keras.Model:
    inputs = tf_keras.Input((4,))
    outputs = tf_keras.layers.Add(name="add")([tf_keras.layers.Dense(4, name="dense")(inputs), inputs])
    return tf_keras.Model(inputs, outputs, name="branch")


def test_chain_of_a_functional_model_leaves_out_its_input_layer():
    inputs = tf_keras.Input((4,))
    outputs = tf_keras.layers.Dense(2, name="second")(tf_keras.layers.Dense(3, name="first")(inputs))
    assert [layer.name for layer in chain_layers(tf_keras.Model(inputs, outputs))] == ["first", "second"]


def test_branching_model_is_a_neutral_clear_error():
    with pytest.raises(ValueError, match=CHAIN_ERROR):
        chain_layers(_branching_model())


def test_model_without_layers_is_a_clear_error():
    with pytest.raises(ValueError, match=r"Model 'empty' has no layers to split across devices."):
        chain_layers(tf_keras.Sequential(name="empty"))


def test_mesh_and_pipeline_give_the_same_chain_error(logical_cpus):
    from tensorfleet.model_parallel.mesh import Mesh
    from tensorfleet.model_parallel.pipeline import Pipeline

    with pytest.raises(ValueError, match=CHAIN_ERROR):
        Mesh("b1:2", "batch:b1").check(_branching_model(), 32)
    with pytest.raises(ValueError, match=CHAIN_ERROR):
        Pipeline(_branching_model(), num_stages=2)
