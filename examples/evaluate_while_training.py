"""Evaluate while training: a side-car evaluator beside two multi-worker mirrored workers.

One script serves every task. In the launcher's ``evaluator`` task, ``sidecar_evaluation(...)`` watches the
checkpoints worker 0 writes, evaluates each on the held-out digits (TensorFlow's
``SidecarEvaluator``), writes ``OUT/eval/evaluation.csv``, TensorBoard summaries and the best model
by validation accuracy (``OUT/eval/best.keras``), and returns True once training has ended and its
last checkpoint is evaluated. In the workers it returns False at once and they train, with early
stopping, so nobody knows the last epoch in advance:

    tensorfleet launch --workers 2 --evaluator examples/evaluate_while_training.py -- --out runs/eval

Run it with ``[--epochs 20] [--patience 2] [--out runs/evaluate_while_training]``.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_model():
    import keras

    model = keras.Sequential([keras.Input(shape=(64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--patience", type=int, default=2)
    parser.add_argument("--out", default="runs/evaluate_while_training")
    args = parser.parse_args(argv)

    import keras

    from tensorfleet import strategies
    from tensorfleet.cluster import checkpoint_callback, sidecar_evaluation
    from tensorfleet.models import load_digits

    split = load_digits(flat=True)
    checkpoints = os.path.join(args.out, "ckpt")
    if sidecar_evaluation(build_model, (split.x_test, split.y_test), checkpoint_dir=checkpoints,
                          out_dir=os.path.join(args.out, "eval"), monitor="accuracy"):
        return 0  # the evaluator task is done: training ended and its last checkpoint is evaluated

    strategy = strategies.build("multi_worker_mirrored")  # mends Keras 3's multi-worker fit (keras#20585)
    with strategy.scope():
        model = build_model()
    model.fit(split.x_train, split.y_train, epochs=args.epochs, batch_size=64, verbose=2,
              validation_data=(split.x_test, split.y_test),
              callbacks=[checkpoint_callback(checkpoints, keras=model),
                         keras.callbacks.EarlyStopping(monitor="val_loss", patience=args.patience)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
