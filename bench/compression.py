"""Compressed all-reduce measured: plain, fp16, PowerSGD rank 2 and 4 under ``tensorfleet launch --workers 2``.

Each contender is the same job, the digits CNN under ``multi_worker_mirrored`` on two local worker processes
(127.0.0.1), started by the ``tensorfleet launch --workers 2`` command: SGD with momentum 0.9, global batch 64,
the same epochs and seeds; only ``compression=`` differs. Per contender:

* bytes per step: what one replica handed the collective in one training step, counted by
  :func:`tensorfleet.strategies.compression.traffic` from the tensors themselves (exact, whatever the load);
* the ratio to the plain run's bytes;
* test accuracy on the 359 held-out digits after the same epochs, mean and spread over ``--seeds`` seeds;
* wall time of the job (a shared 2-core machine: indicative only; the all-reduce here crosses loopback, so
  fewer bytes buy little time).

As in Vogels et al. 2019 (Table 3: "rank 2 ... rank 4" against "SGD"), the uncompressed run is the reference.

Run: ``.venv/bin/python bench/compression.py [--epochs 30] [--seeds 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = ("none", "fp16", "powersgd:rank=2", "powersgd:rank=4")


def worker(args: argparse.Namespace) -> None:
    """One worker of one run (started by the launcher, TF_CONFIG set): train, then the chief writes the result."""
    import numpy as np
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.strategies import compression

    keras = tf.keras  # the user's Keras: Keras 3 on today's TensorFlow
    keras.utils.set_random_seed(args.seed)
    strategy = tfl.strategies.build("multi_worker_mirrored", implementation="ring", timeout_seconds=120,
                                    compression=args.compression)
    data = tfl.models.datasets.load_digits()
    with strategy.scope():
        model = tfl.models.build("digits_cnn", seed=args.seed)
        model.compile(optimizer=keras.optimizers.SGD(args.lr, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(**tfl.strategies.fit_inputs(data.x_train, data.y_train, batch_size=64, strategy=model, seed=args.seed),
              epochs=args.epochs, verbose=0)
    logits = model(data.x_test, training=False)
    accuracy = float(np.mean(np.argmax(np.asarray(logits), axis=1) == data.y_test))
    if strategy.extended.should_checkpoint:  # the chief
        from tensorfleet.io import write_json

        write_json(args.out, {"accuracy": accuracy, **compression.traffic(strategy).as_dict()})


def launch(method: str, seed: int, args: argparse.Namespace, scratch: Path) -> dict:
    out = scratch / f"{method.replace(':', '_')}_{seed}.json"
    command = [str(Path(sys.executable).with_name("tensorfleet")), "launch", "--workers", "2", __file__, "--",
               "--worker", "--compression", method, "--seed", str(seed), "--epochs", str(args.epochs),
               "--lr", str(args.lr), "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{method} seed {seed} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {**json.loads(out.read_text()), "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compression", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    results: dict[str, list[dict]] = {m: [] for m in CONTENDERS}
    with tempfile.TemporaryDirectory() as scratch:
        for seed in range(args.seeds):  # contenders alternate within a seed
            for method in CONTENDERS:
                results[method].append(launch(method, seed, args, Path(scratch)))
                print(f"  ran {method} seed {seed}: {results[method][-1]['accuracy']:.4f}", file=sys.stderr)
    plain_bytes = results["none"][0]["bytes_per_step"]
    plain_acc = statistics.mean(r["accuracy"] for r in results["none"])
    print(f"compressed all-reduce: digits_cnn ({results['none'][0]['gradient_bytes']} gradient bytes), "
          f"tensorfleet launch --workers 2 (multi_worker_mirrored, ring, 127.0.0.1), SGD momentum 0.9 lr {args.lr}, "
          f"global batch 64, {args.epochs} epochs, seeds 0..{args.seeds - 1}")
    print(f"{'compression':<17} {'bytes/step':>10} {'calls':>16} {'vs plain':>9} {'accuracy':>17} {'vs plain':>9} "
          f"{'wall s':>7}")
    for method, runs in results.items():
        accs = [r["accuracy"] for r in runs]
        mean = statistics.mean(accs)
        spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
        calls = "+".join(str(c) for c in runs[0]["calls"])
        print(f"{method:<17} {runs[0]['bytes_per_step']:>10} {calls:>16} "
              f"{plain_bytes / runs[0]['bytes_per_step']:>8.2f}x {100 * mean:>9.2f} +- {100 * spread:4.2f} "
              f"{100 * (mean - plain_acc):>+8.2f} {statistics.mean(r['seconds'] for r in runs):>7.1f}")


if __name__ == "__main__":
    main()
