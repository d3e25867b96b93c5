"""One worker of a 2-process MultiWorkerMirrored job whose input pipeline sleeps a known time per batch.

Run by test_straggler.py, one phase per job (``JOB_PHASE``). ``straggler``: the steps to record and
the directory come from the environment (``TENSORFLEET_PROFILE_STEPS``, ``TENSORFLEET_PROFILE_DIR``)
as a launcher sets them, and the sleep per batch from ``SLEEP_SECONDS`` (0 on the healthy worker).
``sizes``: the workers train, without sleeping, an MLP of each width of ``WIDTHS``, recorded into
``SIZES_DIR/h<width>``.
"""

from __future__ import annotations

import os
import time

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def sleepy_dataset(seconds: float):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x, y = rng.random((256, 32), dtype=np.float32), rng.integers(0, 10, 256)

    def pause(a, b):
        time.sleep(seconds)
        return a, b

    def slowed(a, b):
        a2, b2 = tf.py_function(pause, [a, b], [tf.float32, tf.int64])
        return tf.ensure_shape(a2, (None, 32)), tf.ensure_shape(b2, (None,))

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    return (data.map(slowed) if seconds else data).repeat()


WIDTHS = (64, 1536)


def mlp(width: int):

    return tf_keras.Sequential([tf_keras.Input((32,)), tf_keras.layers.Dense(width, activation="relu"),
                                tf_keras.layers.Dense(width, activation="relu"), tf_keras.layers.Dense(10)])


def main() -> None:
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet import profiling

    strategy = tfl.strategies.build("multi_worker_mirrored", implementation="ring", timeout_seconds=120)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if os.environ["JOB_PHASE"] == "straggler":
        data = sleepy_dataset(float(os.environ.get("SLEEP_SECONDS", "0"))).with_options(options)
        with strategy.scope():
            model = tf_keras.Sequential([tf_keras.Input((32,)), tf_keras.layers.Dense(64, activation="relu"),
                                         tf_keras.layers.Dense(10)])
            model.compile("sgd", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(data, steps_per_epoch=14, epochs=1, verbose=0, callbacks=profiling.callbacks())
        return
    steady = sleepy_dataset(0).prefetch(2).with_options(options)
    for width in WIDTHS:
        with strategy.scope():
            model = mlp(width)
            model.compile("sgd", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        recorder = profiling.ProfileCallback(os.path.join(os.environ["SIZES_DIR"], f"h{width}"), steps="2-7")
        model.fit(steady, steps_per_epoch=9, epochs=1, verbose=0, callbacks=[recorder])

if __name__ == "__main__":
    main()
