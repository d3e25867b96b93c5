"""Plain Keras fit/evaluate/predict/save under the single-process strategies on logical CPUs
(the parameter server has its own module, test_parameter_server.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tensorfleet as tfl
from tensorfleet.compat.keras import keras2
from tests.conftest import compile_digits, test_accuracy

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

EPOCHS = 5
BATCH = 64


def train(strategy: Any, split: Any) -> Any:
    """The one user call, identical for every strategy."""
    with strategy.scope():
        model = tfl.models.build("digits_cnn", keras="tf_keras")  # tf_keras: saved and reloaded with it below
        compile_digits(model)
    model.fit(**tfl.strategies.fit_inputs(split.x_train, split.y_train, batch_size=BATCH, strategy=model),
              epochs=EPOCHS, verbose=0)
    return model


CASES = {
    "one_device": ("one_device", {}),
    "mirrored2": ("mirrored", {"devices": ["/cpu:0", "/cpu:1"]}),
    "mirrored4": ("mirrored", {"devices": ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"]}),
    "central_storage": ("central_storage", {"compute_devices": ["/cpu:0", "/cpu:1"]}),
}


@pytest.fixture(scope="module")
def trained(digits) -> Callable[[str], Any]:
    """Case id -> the model :func:`train` made under that case's strategy, trained the first time a test asks:
    the accuracy test and the replica test read the same mirrored models, and neither changes their weights."""
    models: dict[str, Any] = {}

    def get(case: str) -> Any:
        if case not in models:
            name, options = CASES[case]
            models[case] = train(tfl.strategies.build(name, **options), digits)
        return models[case]

    return get


@pytest.mark.parametrize("case", list(CASES))
def test_digits_cnn_trains_to_90_percent_with_plain_fit(case, trained, digits, tmp_path) -> None:
    model = trained(case)

    accuracy = test_accuracy(model, digits)
    assert accuracy >= 0.90, f"{case}: test accuracy {accuracy:.3f}"

    results = model.evaluate(**tfl.strategies.evaluate_inputs(digits.x_test, digits.y_test, batch_size=BATCH,
                                                              strategy=model),
                             verbose=0, return_dict=True)
    assert set(results) == {"loss", "accuracy"}
    assert results["accuracy"] >= 0.90

    path = tmp_path / "model.keras"
    model.save(path)

    reloaded = tf_keras.models.load_model(path)
    np.testing.assert_allclose(reloaded.predict(digits.x_test[:32], verbose=0),
                               model.predict(digits.x_test[:32], verbose=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("devices", [2, 4])
def test_mirrored_replicas_hold_identical_variables_after_training(devices, trained) -> None:
    model = trained(f"mirrored{devices}")
    for variable in model.trainable_variables:
        replicas = [v.numpy() for v in variable.values]
        assert len(replicas) == devices
        for replica in replicas[1:]:
            np.testing.assert_array_equal(replica, replicas[0])


def test_fit_inputs_reject_bad_input(digits) -> None:
    with pytest.raises(ValueError, match=r"batch_size must be a positive integer. Received: batch_size=0"):
        tfl.strategies.fit_inputs(digits.x_train, digits.y_train, batch_size=0)
    with pytest.raises(ValueError, match=r"x and y must have the same length. Received: len\(x\)=1438, len\(y\)=10"):
        tfl.strategies.fit_inputs(digits.x_train, digits.y_train[:10])
    with pytest.raises(ValueError, match=r"dataset_fn needs steps_per_epoch"):
        tfl.strategies.fit_inputs(None, dataset_fn=lambda ctx: None)
    with pytest.raises(ValueError, match=r"validation_data must be a pair"):
        tfl.strategies.fit_inputs(digits.x_train, digits.y_train, validation_data=digits.x_test)
    with pytest.raises(TypeError, match=r"strategy must be a tf.distribute.Strategy or a Keras model built under one. "
                                        r"Received: strategy=str"):
        tfl.strategies.fit_inputs(digits.x_train, digits.y_train, strategy="mirrored")
