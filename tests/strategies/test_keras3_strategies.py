"""Keras 3 models under the one-process strategies train, evaluate and predict as on one device.

Each run is a small Keras 3 MLP on digits, 2 epochs of Adam, compared with the same model trained without any
strategy: weights, the logged metrics of every epoch, evaluate's metrics and predictions, within float32
tolerance. Every batch divides evenly over the replicas (1,024 training and 320 test examples in batches of
64, over 2 or 4 replicas): a tf.distribute step averages the replicas' mean losses, which is the one-device
mean only when the replicas' batches are equally large, in tf_keras as in Keras 3.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import tensorfleet as tfl
from tensorfleet.compat import keras3_metrics

BATCH = 64
EPOCHS = 2
TRAIN, TEST = 1024, 320
RTOL, ATOL = 1e-5, 1e-6


@dataclass
class Run:
    weights: list[np.ndarray]
    history: dict[str, list[float]]
    evaluated: dict[str, float]
    predictions: np.ndarray


def _mlp(keras: Any) -> Any:
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([keras.Input((64,)),
                              keras.layers.Dense(32, activation="relu", kernel_initializer=init(seed=1)),
                              keras.layers.Dense(10, kernel_initializer=init(seed=2))])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def train(keras: Any, strategy: Any, data: Any, *, inputs: bool) -> Run:
    """The user's code, the same for every strategy: Keras' own arrays, or ``fit_inputs``/``evaluate_inputs``."""
    x, y = data.x_train[:TRAIN], data.y_train[:TRAIN]
    x_test, y_test = data.x_test[:TEST], data.y_test[:TEST]
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = _mlp(keras)
    if inputs:
        # Shuffled (the default): each epoch's order follows the seed and the optimizer's step count, so Keras 3's
        # read of one batch to build the model under a strategy, before its epochs, shifts no epoch's order.
        history = model.fit(**tfl.strategies.fit_inputs(x, y, batch_size=BATCH, strategy=model),
                            epochs=EPOCHS, verbose=0)
        evaluated = model.evaluate(**tfl.strategies.evaluate_inputs(x_test, y_test, batch_size=BATCH, strategy=model),
                                   verbose=0, return_dict=True)
    else:
        history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
        evaluated = model.evaluate(x_test, y_test, batch_size=BATCH, verbose=0, return_dict=True)
    return Run([np.asarray(w) for w in model.get_weights()], history.history, evaluated,
               model.predict(x_test, batch_size=BATCH, verbose=0))


def assert_same(run: Run, reference: Run) -> None:
    assert [w.shape for w in run.weights] == [w.shape for w in reference.weights]
    for got, want in zip(run.weights, reference.weights):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert sorted(run.history) == ["accuracy", "loss"] and sorted(run.evaluated) == ["accuracy", "loss"]
    for key in run.history:
        np.testing.assert_allclose(run.history[key], reference.history[key], rtol=RTOL, atol=ATOL, err_msg=key)
        np.testing.assert_allclose(run.evaluated[key], reference.evaluated[key], rtol=RTOL, atol=ATOL, err_msg=key)
    np.testing.assert_allclose(run.predictions, reference.predictions, rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def references(keras3: Any, digits_flat: Any) -> dict[bool, Run]:
    """One device, no strategy at all: with Keras' own inputs (False) and with fit_inputs (True)."""
    return {inputs: train(keras3, None, digits_flat, inputs=inputs) for inputs in (False, True)}


@pytest.fixture
def central_storage_mend() -> Any:
    """What building ``central_storage`` installs: Keras 3's metrics mend (keras-team/keras#19280, #19891)."""
    installed = keras3_metrics.central_storage_metrics_mended()
    assert keras3_metrics.mend_central_storage_metrics()
    yield
    if not installed:
        keras3_metrics.restore_central_storage_metrics()


CASES = [
    ("one_device", {}),
    ("mirrored", {"devices": ["/cpu:0", "/cpu:1"]}),
    ("mirrored", {}),  # all 4 logical CPUs
    ("central_storage", {"compute_devices": ["/cpu:0", "/cpu:1"]}),
    ("auto", {"announce": False}),  # mirrored over the 4 logical CPUs
]
IDS = ["one_device", "mirrored2", "mirrored4", "central_storage", "auto"]


@pytest.mark.parametrize("inputs", [False, True], ids=["keras_inputs", "fit_inputs"])
@pytest.mark.parametrize("name, options", CASES, ids=IDS)
def test_a_keras3_model_trains_evaluates_and_predicts_as_on_one_device(
        name: str, options: dict[str, Any], inputs: bool, keras3: Any, digits_flat: Any, logical_cpus: list[str],
        references: dict[bool, Run], central_storage_mend: Any) -> None:
    strategy = tfl.strategies.build(name, **options)
    expected_replicas = {"one_device": 1, "central_storage": 2}.get(name, len(options.get("devices", logical_cpus)))
    assert strategy.num_replicas_in_sync == expected_replicas
    run = train(keras3, strategy, digits_flat, inputs=inputs)
    assert_same(run, references[inputs])
    assert run.history["accuracy"][-1] > 0.8  # it learned: the comparison is not of two untrained models


def test_auto_picks_mirrored_over_the_logical_cpus(logical_cpus: list[str]) -> None:
    assert tfl.strategies.choose({}) == ("mirrored", "4 local CPU devices")


def test_keras3_central_storage_metrics_without_the_mend_are_not_one_devices(
        keras3: Any, digits_flat: Any, logical_cpus: list[str], references: dict[bool, Run]) -> None:
    """The upstream defect the mend is for, still there: when Keras fixes it, this fails and the mend can go."""
    installed = keras3_metrics.central_storage_metrics_mended()
    strategy = tfl.strategies.build("central_storage", compute_devices=logical_cpus[:2])  # installs the mend...
    keras3_metrics.restore_central_storage_metrics()  # ...taken out again, to see Keras 3's own metrics
    try:
        run = train(keras3, strategy, digits_flat, inputs=False)
    finally:
        if installed:
            keras3_metrics.mend_central_storage_metrics()
    reference = references[False]
    for got, want in zip(run.weights, reference.weights):  # the training itself is right...
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    # ...the metrics are not: every step multiplies the metric state so far by the 2 replicas.
    assert abs(run.history["accuracy"][0] - reference.history["accuracy"][0]) > 0.01


def test_building_central_storage_installs_the_metrics_mend(keras3: Any, logical_cpus: list[str]) -> None:
    keras3_metrics.restore_central_storage_metrics()
    tfl.strategies.build("central_storage", compute_devices=logical_cpus[:2])
    assert keras3_metrics.central_storage_metrics_mended()


def test_the_mend_changes_nothing_outside_central_storage(keras3: Any, central_storage_mend: Any) -> None:
    metric = keras3.metrics.Mean()
    metric.update_state([1.0, 2.0, 3.0])
    metric.update_state([4.0])
    assert float(metric.result()) == 2.5
    variable = keras3.Variable(1.0, aggregation="sum")
    variable.assign_add(2.0)
    variable.assign_sub(0.5)
    assert float(variable.numpy()) == 2.5


def test_tpu_is_refused_clearly_where_there_is_none() -> None:
    with pytest.raises(tfl.strategies.NoTPUError, match=r"^No TPU is attached to this machine and no tpu_address "
                                                        r"\(or TPU_NAME\) was given\. Received: tpu_address=None\."):
        tfl.strategies.build("tpu")


def test_a_first_batch_that_does_not_split_evenly_trains_as_in_tf_keras(keras3: Any, logical_cpus: list[str],
                                                                          digits_flat: Any) -> None:
    # 50 examples a batch over 4 replicas (13, 13, 12, 12): Keras 3's own fit failed to build the model from
    # such a first batch (AddN of [13, 64] and [11, 64]); mended when tensorfleet builds the strategy. The steps
    # then average the replicas' mean losses, as tf.distribute does for tf_keras: the two Kerases agree.
    from tensorfleet.compat.keras import keras2

    x, y = digits_flat.x_train[:200], digits_flat.y_train[:200]
    weights = []
    for keras in (keras2(), keras3):
        strategy = tfl.strategies.build("mirrored", devices=logical_cpus)
        with strategy.scope():
            model = _mlp(keras)
        if weights:
            model.set_weights(weights[0])
        else:
            weights.append(model.get_weights())
        model.fit(x, y, batch_size=50, epochs=2, shuffle=False, verbose=0)
        weights.append([np.asarray(w) for w in model.get_weights()])
    for got, want in zip(weights[2], weights[1]):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
