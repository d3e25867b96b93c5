from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def digits():
    from tensorfleet.models.datasets import load_digits

    return load_digits()


def compile_digits(model: Any) -> None:
    import tensorflow as tf

    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-2),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def test_accuracy(model: Any, split: Any) -> float:
    import numpy as np

    predictions = model.predict(split.x_test, verbose=0, batch_size=128)
    return float(np.mean(np.argmax(predictions, axis=1) == split.y_test))


test_accuracy.__test__ = False  # a helper, not a test
