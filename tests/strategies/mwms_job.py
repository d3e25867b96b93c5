"""One worker of a 2-process MultiWorkerMirrored job, run by test_multi_worker.py.

Reads its task from TF_CONFIG, trains the digits CNN with plain Keras fit, and writes its
results (accuracy, a digest of the weights, evaluate, reload check) to the JSON path given.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(out_path: str) -> None:
    import numpy as np

    import tensorfleet as tfl
    from tensorfleet.models.datasets import load_digits

    split = load_digits()
    strategy = tfl.strategies.build("multi_worker_mirrored", implementation="ring", timeout_seconds=120)
    with strategy.scope():
        model = tfl.models.build("digits_cnn", keras=tf_keras)
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-2),
                      loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(**tfl.strategies.fit_inputs(split.x_train, split.y_train, batch_size=64, strategy=model),
              epochs=5, verbose=0)
    evaluation = model.evaluate(**tfl.strategies.evaluate_inputs(split.x_test, split.y_test, batch_size=64,
                                                                  strategy=model), verbose=0, return_dict=True)
    predictions = model.predict(split.x_test, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        reloaded = tf_keras.models.load_model(path)
        reload_diff = float(np.max(np.abs(reloaded.predict(split.x_test, verbose=0) - predictions)))
    weights = model.get_weights()
    result = {
        "task": json.loads(os.environ["TF_CONFIG"])["task"],
        "replicas": strategy.num_replicas_in_sync,
        "test_accuracy": float(np.mean(np.argmax(predictions, axis=1) == split.y_test)),
        "evaluate": evaluation,
        "reload_max_abs_diff": reload_diff,
        "weights": [w.ravel().tolist() for w in weights],
    }
    from tensorfleet.io import write_json

    write_json(out_path, result)


if __name__ == "__main__":
    main(sys.argv[1])
