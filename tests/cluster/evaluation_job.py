"""The evaluator side of tests/cluster/test_evaluation.py: a digits MLP's checkpoints, evaluated.

Run as ``python -m tests.cluster.evaluation_job CHECKPOINT_DIR OUT LAST`` (an evaluator process of
its own), or under the launcher with ``--launched CHECKPOINT_DIR OUT EPOCHS``: the same script then
trains in the worker task and evaluates in the evaluator task.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_model():
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(64,)),
                                 tf.keras.layers.Dense(10)])
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-2),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def main() -> int:
    from tensorfleet.cluster.evaluation import checkpoint_callback, evaluation
    from tensorfleet.models.datasets import load_digits

    launched = sys.argv[1] == "--launched"
    checkpoint_dir, out, last = sys.argv[1 + launched:4 + launched]
    split = load_digits(flat=True)
    if evaluation(build_model, (split.x_test, split.y_test), checkpoint_dir=checkpoint_dir, out=out,
                  monitor="accuracy", last_checkpoint=int(last), force=not launched,
                  log=lambda line: print(f"evaluator: {line}", flush=True)):
        return 0
    build_model().fit(split.x_train, split.y_train, epochs=int(last), batch_size=64, verbose=2,
                      callbacks=[checkpoint_callback(checkpoint_dir)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
