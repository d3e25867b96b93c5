"""One recording shared by the profiling tests: Keras fit with a sleep injected in its input pipeline."""

from __future__ import annotations

import pytest

from tests.profiling.slow_worker_job import sleepy_dataset

SLEEP_MS = 40.0


@pytest.fixture(scope="session")
def recorded(tmp_path_factory):
    import tensorflow as tf

    from tensorfleet import profiling

    logdir = tmp_path_factory.mktemp("profile")
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = profiling.ProfileCallback(logdir, steps="3-12")
    model.fit(sleepy_dataset(SLEEP_MS / 1000), steps_per_epoch=15, epochs=1, verbose=0, callbacks=[callback])
    return logdir, callback
