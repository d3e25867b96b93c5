"""A migratable job for the migration tests: a small MLP on the first 96 training digits."""

from __future__ import annotations

EXAMPLES = 96


def build_model():
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-2),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data():
    from tensorfleet.models.datasets import load_digits

    split = load_digits()
    return split.x_train[:EXAMPLES].reshape(EXAMPLES, -1), split.y_train[:EXAMPLES]
