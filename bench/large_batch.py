"""Large-batch recipes measured: the digits CNN at a global batch of 32 and of 512 for the same epochs.

As in Goyal et al. 2017 (Table: "error vs minibatch size"), the small-batch run is the reference and
each large-batch recipe is compared with it, the same number of epochs (so 16x fewer steps at 512):

* ``32 SGD``: SGD with momentum 0.9 at ``base_lr`` (the reference);
* ``512 SGD, same lr``: the batch grown, the learning rate not;
* ``512 SGD, linear + warm-up``: :func:`tensorfleet.strategies.large_batch.scaled_learning_rate`, linear rule
  (``base_lr * 512 / 32``), linear warm-up over the first ``--warmup`` epochs from ``base_lr``;
* ``512 SGD, sqrt + warm-up``: the same with the square-root rule (``base_lr * 4``);
* ``512 LARS``: :func:`tensorfleet.strategies.layerwise.lars` with the same scaling and warm-up (``eta`` 0.05
  picked from 0.01, 0.02, 0.05, 0.1 on seed 0 at 40 epochs; a global rate of 1.0, as for LARS on ImageNet,
  diverged: the biases, left out of the adaptation, take it as plain SGD);
* ``512 LAMB``: :func:`tensorfleet.strategies.layerwise.lamb` (Keras 3: ``keras.optimizers.Lamb``) at ``--lamb-lr``
  for 32, square-root rule to 512, the same warm-up.

One process, one device (the global batch is what matters here, not how it is split); the Keras is the
user's (``tf.keras``: Keras 3 unless TF_USE_LEGACY_KERAS=1). Test accuracy on the 359 held-out digits,
mean and standard deviation over ``--seeds`` seeds (model initialisation and shuffling).

Run: ``.venv/bin/python bench/large_batch.py [--epochs 40] [--seeds 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def run(recipe: str, batch: int, seed: int, args: argparse.Namespace) -> float:

    import tensorfleet as tfl
    from tensorfleet.compat.keras import keras_module, set_random_seed, user_keras
    from tensorfleet.strategies import large_batch, layerwise

    K = keras_module(user_keras())
    set_random_seed(seed)
    data = tfl.models.datasets.load_digits()
    model = tfl.models.build("digits_cnn", seed=seed)
    callbacks = []
    warm = {"reference_batch": 32, "global_batch": batch, "warmup_epochs": args.warmup, "keras": model}
    if recipe == "SGD":
        optimizer = K.optimizers.SGD(args.lr, momentum=0.9)
    elif recipe == "SGD, linear + warm-up":
        optimizer = K.optimizers.SGD(args.lr, momentum=0.9)
        callbacks.append(large_batch.scaled_learning_rate(base_lr=args.lr, **warm))
    elif recipe == "SGD, sqrt + warm-up":
        optimizer = K.optimizers.SGD(args.lr, momentum=0.9)
        callbacks.append(large_batch.scaled_learning_rate(base_lr=args.lr, rule="sqrt", **warm))
    elif recipe == "LARS, linear + warm-up":
        optimizer = layerwise.lars(args.lars_lr, momentum=0.9, eta=args.eta, weight_decay=1e-4, keras=model)
        callbacks.append(large_batch.scaled_learning_rate(base_lr=args.lars_lr, **warm))
    elif recipe == "LAMB, sqrt + warm-up":
        optimizer = layerwise.lamb(args.lamb_lr, weight_decay=1e-4, keras=model)
        callbacks.append(large_batch.scaled_learning_rate(base_lr=args.lamb_lr, rule="sqrt", **warm))
    else:
        raise ValueError(recipe)
    model.compile(optimizer=optimizer, loss=K.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(data.x_train, data.y_train, batch_size=batch, epochs=args.epochs, shuffle=True, verbose=0,
              callbacks=callbacks)
    _, accuracy = model.evaluate(data.x_test, data.y_test, batch_size=359, verbose=0)
    return float(accuracy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5, help="warm-up epochs of the scaled recipes")
    parser.add_argument("--lr", type=float, default=0.02, help="SGD learning rate at batch 32")
    parser.add_argument("--lars-lr", type=float, default=0.02, help="LARS learning rate at batch 32")
    parser.add_argument("--eta", type=float, default=0.05, help="LARS trust coefficient")
    parser.add_argument("--lamb-lr", type=float, default=0.002, help="LAMB learning rate at batch 32")
    args = parser.parse_args()

    from tensorfleet.compat.keras import keras_flavour

    contenders = [(32, "SGD"), (512, "SGD"), (512, "SGD, linear + warm-up"), (512, "SGD, sqrt + warm-up"),
                  (512, "LARS, linear + warm-up"),
                  (512, "LAMB, sqrt + warm-up")]
    print(f"large batch: digits_cnn, {args.epochs} epochs, {args.seeds} seeds, keras={keras_flavour()}, "
          f"SGD lr {args.lr} at 32 (momentum 0.9), LARS lr {args.lars_lr} eta {args.eta}, LAMB lr {args.lamb_lr}, "
          f"warm-up {args.warmup} epochs")
    results: dict[tuple[int, str], list[float]] = {}
    start = time.perf_counter()
    for seed in range(args.seeds):
        for batch, recipe in contenders:
            results.setdefault((batch, recipe), []).append(run(recipe, batch, seed, args))
    reference = statistics.mean(results[(32, "SGD")])
    print(f"{'global batch':>12}  {'recipe':<24} {'test acc % (mean)':>17} {'sd':>5} {'vs batch 32':>11}  per seed")
    for (batch, recipe), accs in results.items():
        mean = statistics.mean(accs)
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        print(f"{batch:>12}  {recipe:<24} {100 * mean:>17.2f} {100 * sd:>5.2f} {100 * (mean - reference):>+11.2f}  "
              + " ".join(f"{100 * a:.2f}" for a in accs))
    print(f"wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
