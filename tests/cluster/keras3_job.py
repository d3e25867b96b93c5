"""A migratable job written in Keras 3 (``import keras``), as a user writes it today: migrating_job.py's MLP on the
first 96 training digits."""

from __future__ import annotations

EXAMPLES = 96


def build_model():
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data():
    from tensorfleet.models.datasets import load_digits

    split = load_digits()
    return split.x_train[:EXAMPLES].reshape(EXAMPLES, -1), split.y_train[:EXAMPLES]
