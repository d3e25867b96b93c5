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
        model = tfl.models.build("digits_cnn")
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-2),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    inputs = tfl.strategies.fit_inputs(split.x_train, split.y_train, batch_size=64, strategy=model,
                                       validation_data=(split.x_test, split.y_test))
    history = model.fit(**inputs, epochs=5, verbose=0)
    evaluation = model.evaluate(**tfl.strategies.evaluate_inputs(split.x_test, split.y_test, batch_size=64,
                                                                  strategy=model), verbose=0, return_dict=True)
    predictions = model.predict(split.x_test, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "saved_model")  # SavedModel format: restores sharded variables whole
        model.save(path)
        reloaded = tf.keras.models.load_model(path)
        reload_diff = float(np.max(np.abs(reloaded.predict(split.x_test, verbose=0) - predictions)))

    class PerBatch(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    try:
        model.fit(**inputs, epochs=1, verbose=0, callbacks=[PerBatch()])
        callback_error = ""
    except ValueError as exc:
        callback_error = str(exc)
    gate = tfl.strategies.staleness.installed_gate(tf.distribute.experimental.coordinator.ClusterCoordinator(strategy))
    print(json.dumps({
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
        "staleness": gate.policy.label,
        "max_clock_gap": max(gate.clocks) - min(gate.clocks),
    }))
    sys.stdout.flush()
    os._exit(0)  # in-process servers would keep the interpreter alive


if __name__ == "__main__":
    main()
