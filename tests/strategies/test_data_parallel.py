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


def _epoch_orders(inputs: Any, counter: Any, starts: list[int]) -> list[list[int]]:
    """The example order ``inputs`` reads in a pass begun with the step counter at each of ``starts`` (y holds
    each example's index)."""
    orders = []
    for start in starts:
        counter.assign(start)
        orders.append([int(i) for _, y in inputs["x"] for i in y.numpy()])
    return orders


def test_fit_inputs_orders_each_epoch_by_the_seed_and_the_step_count(digits_flat) -> None:
    # 100 examples in batches of 32: 4 steps an epoch. A pass begun at step 4 or 5 is epoch 1 (the epoch's first
    # read may come before or after its first step's count), at 8 epoch 2; the order is a permutation, another
    # for another epoch or seed, and the same again for the same epoch: what a resumed job reads.
    keras = keras2()
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.compile("sgd", "sparse_categorical_crossentropy")
    x, index = digits_flat.x_train[:100], np.arange(100)
    inputs = tfl.strategies.fit_inputs(x, index, batch_size=32, strategy=model, seed=3)
    assert inputs["x"].cardinality().numpy() == 4 and inputs["shuffle"] is False
    first, again, late, second = _epoch_orders(inputs, model.optimizer.iterations, [4, 4, 5, 8])
    assert sorted(first) == list(range(100)) and first != list(range(100))
    assert first == again == late and first != second
    other = tfl.strategies.fit_inputs(x, index, batch_size=32, strategy=model, seed=4)
    assert _epoch_orders(other, model.optimizer.iterations, [4]) != [first]
    # Without the model there is no step count to follow: Keras's seeded reshuffle, anew in every pass.
    plain = tfl.strategies.fit_inputs(x, index, batch_size=32, strategy=tfl.strategies.build("one_device"), seed=3)
    assert [int(i) for _, y in plain["x"] for i in y.numpy()] != [int(i) for _, y in plain["x"] for i in y.numpy()]


class Killed(Exception):
    pass


@pytest.mark.parametrize("which", ["tf_keras", "keras3"])
def test_a_fit_resumed_from_its_backup_ends_with_the_uninterrupted_weights(which, digits_flat, logical_cpus, tmp_path,
                                                                          request) -> None:
    # fit_inputs shuffles (its default); the run stops after epoch 2 of 4 and a new model resumes from the backup.
    # Before each epoch's order followed the step count, the resumed epochs read the orders of passes 0 and 1.
    keras = keras2() if which == "tf_keras" else request.getfixturevalue("keras3")
    x, y = digits_flat.x_train[:300], digits_flat.y_train[:300]

    class Stop(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch == 1:
                raise Killed  # what a killed job leaves: the backup of epoch 2

    def fit(backup: Any, *extra: Any) -> Any:
        strategy = tfl.strategies.build("mirrored", devices=logical_cpus[:2])
        with strategy.scope():
            keras.utils.set_random_seed(5)
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(10)])
            model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(**tfl.strategies.fit_inputs(x, y, batch_size=64, strategy=model), epochs=4, verbose=0,
                  callbacks=[*tfl.cluster.callbacks(backup, keras=model, log=False), *extra])
        return model

    uninterrupted = fit(tmp_path / "a").get_weights()
    with pytest.raises(Killed):
        fit(tmp_path / "b", Stop())
    resumed = fit(tmp_path / "b")
    assert int(resumed.optimizer.iterations.numpy()) == 4 * 5
    for got, want in zip(resumed.get_weights(), uninterrupted):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
