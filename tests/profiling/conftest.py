"""One recording shared by the profiling tests: Keras fit with a sleep injected in its input pipeline."""

from __future__ import annotations

import pytest

from tensorfleet.compat.keras import keras2
from tests.profiling.slow_worker_job import sleepy_dataset

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

SLEEP_MS = 40.0


@pytest.fixture(scope="session")
def recorded(tmp_path_factory):

    from tensorfleet import profiling

    logdir = tmp_path_factory.mktemp("profile")
    model = tf_keras.Sequential([tf_keras.Input((32,)), tf_keras.layers.Dense(64, activation="relu"),
                                 tf_keras.layers.Dense(10)])
    model.compile("sgd", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = profiling.ProfileCallback(logdir, steps="3-12")
    model.fit(sleepy_dataset(SLEEP_MS / 1000), steps_per_epoch=15, epochs=1, verbose=0, callbacks=[callback])
    return logdir, callback
