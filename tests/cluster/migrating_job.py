"""A migratable job for the migration tests: a small MLP on the first 96 training digits."""

from __future__ import annotations

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

EXAMPLES = 96


def build_model():

    model = tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(16, activation="relu"),
                                 tf_keras.layers.Dense(10)])
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-2),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data():
    from tensorfleet.models.datasets import load_digits

    split = load_digits()
    return split.x_train[:EXAMPLES].reshape(EXAMPLES, -1), split.y_train[:EXAMPLES]
