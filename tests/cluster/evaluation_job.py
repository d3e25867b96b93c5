"""The evaluator side of tests/cluster/test_evaluation.py: a digits MLP's checkpoints, evaluated.

Run as ``python -m tests.cluster.evaluation_job CHECKPOINT_DIR OUT EPOCHS`` (an evaluator process of
its own that stops after checkpoint EPOCHS), or under the launcher with ``--launched``: the same
script then trains in the worker task and evaluates in the evaluator task. ``--until-training-ends``
leaves the last checkpoint unsaid (the evaluator stops when the launcher says training has ended);
``--repeat K`` evaluates on the test set K times over (a slower evaluation); ``--pause S`` makes the
trainer wait S seconds after every epoch's checkpoint but the last; ``--hard-exit`` ends the trainer
right after its last checkpoint (``os._exit``, without TensorFlow's seconds of teardown).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_model():

    model = tf_keras.Sequential([tf_keras.layers.Dense(16, activation="relu", input_shape=(64,)),
                                 tf_keras.layers.Dense(10)])
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-2),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def held_out(repeat: int = 1):
    """The evaluation data: the digits test split, ``repeat`` times over."""
    import numpy as np

    from tensorfleet.models.datasets import load_digits

    split = load_digits(flat=True)
    return np.tile(split.x_test, (repeat, 1)), np.tile(split.y_test, repeat)


def main() -> int:

    from tensorfleet.cluster.evaluation import checkpoint_callback, evaluation
    from tensorfleet.models.datasets import load_digits

    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--launched", action="store_true")
    parser.add_argument("--until-training-ends", action="store_true")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--hard-exit", action="store_true")
    args = parser.parse_args()
    last = None if args.until_training_ends else args.epochs
    if evaluation(build_model, held_out(args.repeat), checkpoint_dir=args.checkpoint_dir, out_dir=args.out,
                  monitor="accuracy", last_checkpoint=last, force=not args.launched,
                  log=lambda line: print(f"evaluator: {line}", flush=True)):
        return 0
    split = load_digits(flat=True)
    pause = tf_keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: time.sleep(args.pause if epoch + 1 < args.epochs else 0.0))
    model = build_model()
    model.fit(split.x_train, split.y_train, epochs=args.epochs, batch_size=64, verbose=2,
              callbacks=[checkpoint_callback(args.checkpoint_dir, keras=model), pause])
    if args.hard_exit:
        sys.stdout.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
