"""A small parameter-server training script, run by test_parameter_server.py under ``tensorfleet launch``.

Every task runs it: the workers and the ps task serve (``strategies.build`` blocks there), the chief
trains an MLP on synthetic data with Adam for ``STEPS`` steps. By default through Keras' ``fit``
(one epoch); with ``--loop DIR`` through a custom loop of ``ClusterCoordinator.schedule`` calls that
records steps ``LOOP_STEPS`` with ``tfl.profiling.capture`` into ``DIR``.
"""

from __future__ import annotations

import os
import sys

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STEPS = 24
LOOP_STEPS = "6-13"


def _data():
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.random((1024, 32), dtype=np.float32), rng.integers(0, 10, 1024)


def _model():

    return tf_keras.Sequential([tf_keras.Input((32,)), tf_keras.layers.Dense(64, activation="relu"),
                                tf_keras.layers.Dense(10)])


def custom_loop(strategy, logdir: str) -> int:
    import tensorflow as tf

    from tensorfleet import profiling

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model, optimizer = _model(), tf_keras.optimizers.Adam()
    x, y = _data()
    per_worker = coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat())
    iterator = iter(per_worker)

    @tf.function
    def step(iterator):
        def replica(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
                    labels, model(features, training=True), from_logits=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.run(replica, args=next(iterator))

    with profiling.capture(logdir, steps=LOOP_STEPS, coordinator=coordinator) as cap:
        for number in range(STEPS):
            with cap.step(number):
                coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    return int(optimizer.iterations.numpy())


def main() -> None:

    from tensorfleet import strategies

    strategy = strategies.build("parameter_server")
    if sys.argv[1:2] == ["--loop"]:
        print(f"iterations={custom_loop(strategy, sys.argv[2])}", flush=True)
        return
    x, y = _data()
    with strategy.scope():
        model = _model()
        model.compile("adam", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(**strategies.fit_inputs(x, y, batch_size=32, strategy=model, steps_per_epoch=STEPS), epochs=1, verbose=0)
    print(f"iterations={int(model.optimizer.iterations.numpy())}", flush=True)


if __name__ == "__main__":
    main()
