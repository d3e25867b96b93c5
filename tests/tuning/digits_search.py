"""A tiny search script for the tests: an MLP on scikit-learn's digits, two hyperparameters."""


from tensorfleet.compat.keras import keras_module
from tensorfleet.compat.keras_tuner import search_keras
from tensorfleet.models.datasets import load_digits

# The Keras whose models Keras Tuner drives in this process: Keras 3 in a user's default process, tf_keras where
# TF_USE_LEGACY_KERAS=1 is set (and tf.keras, Keras 2.14, on the tff track).
keras = keras_module(search_keras())


def build_model(hp):
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(hp.Choice("units", [8, 32]), activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(hp.Choice("learning_rate", [1e-3, 1e-2])),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def data():
    split = load_digits(flat=True)
    return split.x_train, split.y_train, split.x_test, split.y_test
