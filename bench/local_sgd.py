"""Local SGD against plain multi-worker mirrored training: all-reduces per epoch and test accuracy.

Each contender is one ``tensorfleet launch --workers 2`` job (multi-worker mirrored, ring collectives,
127.0.0.1) training the digits CNN with the user's ``import keras`` (Keras 3; ``--keras keras2`` for tf_keras)
for the same epochs, global batch, optimizer and seed: plain (Keras's own synchronous step) and
``tfl.strategies.LocalSGD(every=H)`` for each H of ``--every``. All-reduces are measured in the workers:
collective ops of each traced training/averaging function x how often it ran (the epoch-end reads of the
metrics, the same in every contender, not counted). Each worker prints its count, its test accuracy and the
sum of |weights|, so the two workers' final weights can be seen to agree.

Example:
    python bench/local_sgd.py --epochs 12 --every 4 16
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
MARK = "local-sgd-bench:"


def job(args: argparse.Namespace) -> None:
    """One worker of a launched job (TF_CONFIG from the launcher)."""
    import numpy as np
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.compat.keras import keras_module
    from tensorfleet.models.datasets import load_digits
    from tensorfleet.strategies.local_sgd import step_all_reduces

    K = keras_module(args.keras)
    K.utils.set_random_seed(args.seed)
    strategy = tfl.strategies.build("multi_worker_mirrored", implementation="ring", timeout_seconds=120)
    split = load_digits(seed=args.seed)
    train = tf.data.Dataset.from_tensor_slices((split.x_train, split.y_train)).shuffle(
        len(split.x_train), seed=args.seed).batch(args.global_batch, drop_remainder=True)
    with strategy.scope():
        model = tfl.models.build("digits_cnn", seed=args.seed, keras=args.keras)
        model.compile(optimizer=K.optimizers.SGD(args.learning_rate, momentum=0.9),
                      loss=K.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    callbacks = [tfl.strategies.LocalSGD(every=args.every, keras=model)] if args.every else []
    start = time.perf_counter()
    model.fit(train, epochs=args.epochs, callbacks=callbacks, verbose=0)
    seconds = time.perf_counter() - start
    steps = int(model.optimizer.iterations.numpy())
    if callbacks:
        counts = dict(callbacks[0].all_reduces)
    else:
        counts = {"sync_steps": steps * step_all_reduces(model)}
    _, accuracy = model.evaluate(split.x_test, split.y_test, batch_size=args.global_batch, verbose=0)
    weights = float(sum(np.abs(w).sum() for w in model.get_weights()))
    print(MARK, json.dumps({"every": args.every, "steps": steps, "all_reduces": counts, "accuracy": accuracy,
                            "sum_abs_weights": weights, "seconds": seconds}), flush=True)


def _launch(args: argparse.Namespace, every: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}  # the user's process
    command = [str(Path(sys.executable).with_name("tensorfleet")), "launch", "--workers", "2", "--timeout", "900",
               __file__, "--job", "--every", str(every), "--epochs", str(args.epochs), "--keras", args.keras,
               "--global-batch", str(args.global_batch), "--learning-rate", str(args.learning_rate),
               "--seed", str(args.seed)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200, check=False)
    found = [json.loads(m.group(1)) for m in re.finditer(rf"{MARK} (.*)$", done.stdout, re.MULTILINE)]
    if done.returncode != 0 or len(found) != 2:
        raise RuntimeError(f"the H={every} job failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--every", type=int, nargs="+", default=[4, 16], help="the H values to compare")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--keras", default="keras3", choices=["keras3", "keras2"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.job:
        args.every = args.every[0]
        return job(args)

    rows = []
    for every in [0, *args.every]:
        workers = _launch(args, every)
        first = workers[0]
        total = sum(first["all_reduces"].values())
        rows.append((every, first["steps"], total, [w["accuracy"] for w in workers],
                     max(w["sum_abs_weights"] for w in workers) - min(w["sum_abs_weights"] for w in workers),
                     first["seconds"], first["all_reduces"]))
    plain = rows[0][2]
    print(f"digits CNN, 2 workers (tensorfleet launch), {args.keras}, {args.epochs} epochs, global batch "
          f"{args.global_batch}, SGD lr {args.learning_rate} momentum 0.9, seed {args.seed}")
    print(f"{'run':<12}{'steps':>7}{'all-reduces':>13}{'per epoch':>11}{'vs plain':>10}{'test acc':>10}"
          f"{'workers |w| diff':>18}{'fit s':>8}")
    for every, steps, total, accuracies, diff, seconds, counts in rows:
        name = "plain" if every == 0 else f"local H={every}"
        print(f"{name:<12}{steps:>7}{total:>13}{total / args.epochs:>11.1f}{plain / total:>9.1f}x"
              f"{accuracies[0] * 100:>9.2f}%{diff:>18.2e}{seconds:>8.1f}   {counts}")


if __name__ == "__main__":
    main()
