"""A tiny search script for the tests: an MLP on scikit-learn's digits, two hyperparameters."""

import tensorflow as tf

from tensorfleet.models.datasets import load_digits


def build_model(hp):
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(hp.Choice("units", [8, 32]), activation="relu", input_shape=(64,)),
        tf.keras.layers.Dense(10),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(hp.Choice("learning_rate", [1e-3, 1e-2])),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def data():
    split = load_digits(flat=True)
    return split.x_train, split.y_train, split.x_test, split.y_test
