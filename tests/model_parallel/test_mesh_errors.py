"""A Mesh refuses what it cannot split with one error that says what is wrong, what it received and
what would be right, the same on every backend (the errors come before any backend runs)."""

from __future__ import annotations

import re

import pytest
import tensorflow as tf

from tensorfleet import models
from tensorfleet.compat.keras import keras2
from tensorfleet.model_parallel import mesh as tfmesh
from tensorfleet.models.datasets import load_digits

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

BATCH, STEPS = 32, 5


def _data(name="digits_mlp"):
    split = load_digits(flat=True)
    return split.x_train[: STEPS * BATCH], split.y_train[: STEPS * BATCH]


SUPPORTED = ("The mtf and keras mesh backends (and Mesh.fit) run Sequential and functional models that are chains "
             "of Dense (activation linear, relu, sigmoid, tanh), GlobalAveragePooling1D and tensorfleet's "
             "TransformerBlock layers (the block keeps its residual connections inside), ending in a Dense of class "
             "logits. Any other Keras model trains with its own compile and fit when built and compiled inside "
             "mesh.scope() of a Mesh with backend='dtensor'.")
_layers = tf_keras.layers


def _unbuilt():
    return tf_keras.Sequential([_layers.Dense(32, activation="relu"), _layers.Dense(10)], name="unbuilt")


def _skip():
    inputs = tf_keras.Input((64,), name="pixels")
    hidden = _layers.Dense(64, activation="relu", name="hidden")(inputs)
    outputs = _layers.Dense(10, name="logits")(_layers.Add(name="skip")([hidden, inputs]))
    return tf_keras.Model(inputs, outputs, name="residual")


def _shared():
    inputs = tf_keras.Input((64,), name="pixels")
    dense = _layers.Dense(64, activation="relu", name="twice")
    return tf_keras.Model(inputs, _layers.Dense(10, name="logits")(dense(dense(inputs))), name="shared")


class _Subclassed(tf_keras.Model):
    def __init__(self):
        super().__init__(name="mine")
        self.dense = _layers.Dense(10)

    def call(self, inputs):
        return self.dense(inputs)


def _subclassed():
    model = _Subclassed()
    model(tf.zeros((1, 64)))
    return model


def _sequential(*layers, name):
    return tf_keras.Sequential([tf_keras.Input((64,)), *layers], name=name)


CHAIN = ("Splitting a model across devices needs a model whose layers form one chain (each layer feeding the next); "
         "layer {layer!r} of model {model!r} does not. Wrap branching parts in one layer. " + SUPPORTED +
         " Received: layer {layer!r} of type {kind}, which {why}")
UNSUPPORTED_MODELS = {
    "unbuilt": (_unbuilt, "A Mesh lays out tensor dimensions from the model's input shape, and model 'unbuilt' has "
                          "none yet: build the model first (model.build(input_shape), e.g. model.build((None,) + "
                          "x.shape[1:])) or give it an Input (tf.keras.Input(shape) as its first layer). Received: "
                          "Sequential model 'unbuilt' with built=False"),
    "subclassed": (_subclassed, "A Mesh reads the model's layers in the order they run, which Keras records only "
                                "for Sequential and functional models; write model 'mine' as one of those. "
                                "Received: subclassed model 'mine' of type _Subclassed"),
    "skip": (_skip,
             CHAIN.format(layer="skip", model="residual", kind="Add", why="takes 2 inputs ('hidden', 'pixels')")),
    "shared": (_shared, CHAIN.format(layer="twice", model="shared", kind="Dense", why="is called 2 times")),
    "layer": (lambda: _sequential(_layers.Dense(8), _layers.Dropout(0.1, name="drop"), _layers.Dense(10), name="d"),
              SUPPORTED + " Received: layer 'drop' of type Dropout"),
    "activation": (lambda: _sequential(_layers.Dense(8, activation="gelu", name="g"), _layers.Dense(10), name="a"),
                   SUPPORTED + " Received: layer 'g' of type Dense with activation 'gelu'"),
    "last": (lambda: tf_keras.Sequential([tf_keras.Input((8, 8)), _layers.Dense(16), _layers.GlobalAveragePooling1D(
        name="pool")]), SUPPORTED + " Received: last layer 'pool' of type GlobalAveragePooling1D"),
}


@pytest.mark.parametrize("backend", ["mtf", "keras", "dtensor"])
@pytest.mark.parametrize("case", sorted(UNSUPPORTED_MODELS))
def test_unsupported_model_is_one_mesh_worded_error_on_every_backend(case, backend, logical_cpus):
    build, message = UNSUPPORTED_MODELS[case]
    x, y = _data("digits_mlp")
    mesh = tfmesh.Mesh("b1:2;b2:2", "batch:b1", backend=backend)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        mesh.fit(build(), x, y, batch_size=BATCH, verbose=False)


def test_model_that_is_not_keras_is_a_type_error(logical_cpus):
    x, y = _data("digits_mlp")
    with pytest.raises(TypeError, match=r"^A Mesh trains a Keras model. Received: model='mlp' of type str$"):
        tfmesh.Mesh("b1:2", "batch:b1").fit("mlp", x, y, batch_size=BATCH, verbose=False)


def test_sequential_built_as_the_error_says_trains(logical_cpus):
    x, y = _data("digits_mlp")
    model = _unbuilt()
    model.build((None,) + x.shape[1:])
    history = tfmesh.Mesh("b1:2;b2:2", "batch:b1;hidden:b2", backend="keras").fit(
        model, x, y, batch_size=BATCH, verbose=False)
    assert len(history.step_loss) == STEPS


@pytest.mark.parametrize("backend", ["mtf", "keras", "dtensor"])
def test_inputs_of_another_shape_than_the_models_are_refused(backend, logical_cpus):
    x, y = _data("digits_mlp")
    with pytest.raises(ValueError, match=r"^x must hold examples of the model's input shape \(64,\). Received: x of "
                                         r"shape \(160, 32\) for model 'digits_mlp'$"):
        tfmesh.Mesh("b1:2", "batch:b1", backend=backend).fit(models.build("digits_mlp", keras="tf_keras"), x[:, :32], y,
                                                             batch_size=BATCH, verbose=False)
