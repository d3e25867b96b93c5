"""Shared, cached fixtures for the edge tests: one trained digits CNN and its conversions.

Conversions take about a second each on this machine, so every artifact is made once per
session and shared by the test modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

MODES = ("float32", "dynamic", "float16", "int8", "int16x8")


@pytest.fixture(scope="session")
def digits_model(digits: Any) -> Any:
    import tensorflow as tf

    from tensorfleet import models

    tf.keras.utils.set_random_seed(0)
    model = models.build("digits_cnn")
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(digits.x_train, digits.y_train, epochs=3, batch_size=32, verbose=0)
    return model


@pytest.fixture(scope="session")
def digits_artifacts(digits_model: Any, digits: Any) -> dict[str, Any]:
    from tensorfleet import edge

    return {mode: edge.convert(digits_model, mode, digits.x_train, num_calibration_samples=50, progress=False)
            for mode in MODES}


@pytest.fixture(scope="session")
def int8_artifact(digits_artifacts: dict[str, Any]) -> Any:
    return digits_artifacts["int8"]


@pytest.fixture(scope="session")
def sine_path() -> Path:
    import tflite_micro

    path = Path(tflite_micro.__file__).parent / "python" / "tflite_micro" / "sine_float.tflite"
    assert path.is_file()
    return path


@pytest.fixture(scope="session")
def topk_artifact() -> Any:
    """A float model whose TOPK_V2 op TFLite Micro has no kernel for."""
    import tensorflow as tf

    from tensorfleet import edge

    inputs = tf.keras.Input((8,))
    values, _ = tf.math.top_k(inputs, k=3)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(values))
    return edge.convert(model, "float32", progress=False)
