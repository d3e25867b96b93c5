"""Parameter-server checks, run in a child process by test_parameter_server.py.

Connecting to a cluster changes the process's eager context for good (and in-process
servers cannot be stopped), so these checks get a process of their own. Prints one JSON
line of results.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    import numpy as np

    import tensorfleet as tfl

    tfl.strategies.simulate_devices(2)
    import tensorflow as tf

    from tensorfleet.models.datasets import load_digits

    split = load_digits()
    cluster = tfl.strategies.start_in_process_cluster(workers=2, ps=1)
    strategy = tfl.strategies.build("parameter_server", cluster=cluster, max_shards=2, min_shard_bytes=4096,
                                    staleness=2)
    with strategy.scope():
        model = tfl.models.build("digits_cnn", keras=tf_keras)
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-2),
                      loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    inputs = tfl.strategies.fit_inputs(split.x_train, split.y_train, batch_size=64, strategy=model,
                                       validation_data=(split.x_test, split.y_test))
    history = model.fit(**inputs, epochs=5, verbose=0)
    evaluation = model.evaluate(**tfl.strategies.evaluate_inputs(split.x_test, split.y_test, batch_size=64,
                                                                  strategy=model), verbose=0, return_dict=True)
    predictions = model.predict(split.x_test, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "saved_model")  # SavedModel format: restores sharded variables whole
        model.save(path)
        reloaded = tf_keras.models.load_model(path)
        reload_diff = float(np.max(np.abs(reloaded.predict(split.x_test, verbose=0) - predictions)))

    class PerBatch(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    try:
        model.fit(**inputs, epochs=1, verbose=0, callbacks=[PerBatch()])
        callback_error = ""
    except ValueError as exc:
        callback_error = str(exc)
    keras3_error = refused_keras3(strategy, split)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    gate = tfl.strategies.staleness.installed_gate(coordinator)
    staleness_label, max_clock_gap = gate.policy.label, max(gate.clocks) - min(gate.clocks)
    print(json.dumps({
        **input_order(strategy, coordinator),
        "input_type": type(inputs["x"]).__name__,
        "steps_per_epoch": inputs["steps_per_epoch"],
        "validation_steps": inputs["validation_steps"],
        "history_keys": sorted(history.history),
        "test_accuracy": float(np.mean(np.argmax(predictions, axis=1) == split.y_test)),
        "evaluate": evaluation,
        "reload_max_abs_diff": reload_diff,
        "variable_devices": sorted({v.device.split("/device:")[0] for v in model.variables}),
        "dense_kernel_shards": [list(v.shape) for v in model.variables if "dense/kernel" in v.name],
        "callback_error": callback_error,
        "keras3_error": keras3_error,
        "staleness": staleness_label,
        "max_clock_gap": max_clock_gap,
    }))
    sys.stdout.flush()
    os._exit(0)  # in-process servers would keep the interpreter alive


def refused_keras3(strategy, split) -> str:
    """What fit_inputs says of a Keras 3 model built under the parameter server ("" where Keras 3 is absent)."""
    try:
        import keras
    except ImportError:
        return ""
    if not keras.__version__.startswith("3."):
        return ""
    import tensorfleet as tfl

    with strategy.scope():
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    try:
        tfl.strategies.fit_inputs(split.x_train, split.y_train, batch_size=64, strategy=model)
    except TypeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "taken"


def input_order(strategy, coordinator) -> dict:
    """Which example ids each worker reads from fit_inputs, and how often a lockstep Keras epoch
    feeds each example (64 examples tagged by id, batches of 4)."""
    import numpy as np
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.compat import distribute as tf_internals

    n, batch = 64, 4
    ids = np.arange(n, dtype=np.float32)[:, None]
    creator = tfl.strategies.fit_inputs(ids, np.zeros(n, np.float32), batch_size=batch, strategy=strategy)["x"]
    per_worker = iter(coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(creator)))

    @tf.function
    def take(iterator):
        return next(iterator)[0]

    # Two passes over the examples: n / workers per worker and pass, through each worker's own iterator.
    workers = tf_internals.coordinator_cluster(coordinator).workers
    read = {w: [int(i) for _ in range(2 * n // len(workers) // batch)
                for i in worker.create_resource(take, args=(per_worker,)).fetch().ravel()]
            for w, worker in enumerate(workers)}

    class Counting(tf_keras.Model):
        """Counts how often a training step is fed each example."""

        def __init__(self) -> None:
            super().__init__()
            self.seen = tf.Variable(tf.zeros([n], tf.int32), trainable=False)

        def call(self, x):
            return x

        def train_step(self, data):
            x, _ = data
            ids = tf.cast(tf.reshape(x, [-1]), tf.int32)
            self.seen.scatter_nd_add(ids[:, None], tf.ones_like(ids))
            return {}

    previous = tfl.strategies.staleness.installed_gate(coordinator)
    gate = tfl.strategies.staleness.install(coordinator, 0)  # lockstep: each worker runs half the epoch
    with strategy.scope():
        counting = Counting()
        counting.compile(optimizer="sgd")
    counting.fit(**tfl.strategies.fit_inputs(ids, np.zeros(n, np.float32), batch_size=batch, strategy=counting),
                 epochs=1, verbose=0)
    steps_per_worker = list(gate.finished)
    tfl.strategies.staleness.install(coordinator, previous.policy if previous else None)
    return {"ids_read": read, "epoch_counts": counting.seen.numpy().tolist(),
            "epoch_steps_per_worker": steps_per_worker}


if __name__ == "__main__":
    main()
