"""A distributed hyperparameter search on scikit-learn's digits with Keras Tuner.

The script is both the search script and its runner. ``build_model(hp)`` (Keras Tuner's
convention) builds a small CNN whose filters, dense width, dropout and learning rate are the
hyperparameters; ``data()`` returns ``(x, y, x_val, y_val)``. Run as a program, it searches with
Keras Tuner's chief oracle and two tuner workers on 127.0.0.1, then scores the exported best model
on the validation data again. The same search from the shell:

    tensorfleet tune examples/tune_digits.py --workers 2 --max-trials 8 --objective val_accuracy \\
        --algorithm bayesian --epochs 4 --out runs/tune_digits

Run with ``python examples/tune_digits.py [--workers 2] [--max-trials 8] [--algorithm random]
[--epochs 4] [--out runs/tune_digits]`` (``--resume`` continues a search that was stopped).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_model(hp):
    import keras  # Keras 3: Keras Tuner's own Keras (a tf_keras search runs with TF_USE_LEGACY_KERAS=1)

    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(hp.Choice("filters", [8, 16, 32]), 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(hp.Int("units", 16, 128, step=16), activation="relu"),
        keras.layers.Dropout(hp.Float("dropout", 0.0, 0.5, step=0.25)),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(hp.Float("learning_rate", 1e-4, 1e-2, sampling="log")),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def data():
    from tensorfleet.models import load_digits

    split = load_digits()
    return split.x_train, split.y_train, split.x_test, split.y_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-trials", type=int, default=8)
    parser.add_argument("--algorithm", default="random")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", default="runs/tune_digits")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    import keras

    from tensorfleet.tuning import describe, search

    result = search(__file__, workers=args.workers, max_trials=args.max_trials, algorithm=args.algorithm,
                    epochs=args.epochs, out_dir=args.out, resume=args.resume)
    print((result.out_dir / "results.txt").read_text(), end="")
    print(describe(result))
    if result.best_model is not None:
        model = keras.models.load_model(result.best_model)
        _, _, x_val, y_val = data()
        _, accuracy = model.evaluate(x_val, y_val, batch_size=32, verbose=0)
        print(f"best model re-evaluated: val_accuracy={accuracy:.4f} (search: {result.best.score:.4f})")


if __name__ == "__main__":
    main()
