"""The compiled backend on TensorFlow worker processes against one process: rounds/s, side by side (current track;
bench/federated_workers.py measures TFF's workers on the tff track).

``--clients`` IID clients (100) of scikit-learn's digits, 8 per round, FedAvg, the same seed; the model is an MLP of
``--hidden`` units in two hidden layers (``--hidden 512``: 298,506 weights) trained ``--local-epochs``
local epochs a round, so that a client's work outweighs sending it the round's weights and examples.
Each contender runs in a process of its own (a process joins one set of workers), one after the other,
``--repeats`` times alternating:

* ``one process``: ``Simulation(..., backend="compiled")``, a lane per core;
* ``N workers``: the same with ``workers=`` N ``tensorflow`` workers on 127.0.0.1 started by the child
  (``TfWorker``), one lane a worker.

Steady rounds/s: rounds 2 to ``--rounds`` (the first traces). Prints each run, then the medians and their
ratio to one process, and the largest weight difference of each against one process (float32 rounding: the
same updates summed in another order). On a machine of C cores, N workers share them with this process: the
ratio says what spreading costs or gains here; across machines each worker brings its own cores.

Run with ``python bench/federated_tf_workers.py [--rounds 20] [--workers 1,2,4] [--hidden 512] [--local-epochs 2]
[--repeats 2] [--clients 100]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parents[1]


def child(workers: int, rounds: int, hidden: int, local_epochs: int, num_clients: int) -> None:
    import keras
    import numpy as np
    import portpicker

    import tensorfleet as tfl
    from tensorfleet.federated.backends.compiled.workers import TfWorker

    split = tfl.models.datasets.load_digits(flat=True)
    clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=num_clients, scheme="iid", seed=0)

    def model_fn():
        return keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"),
                                 keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(10)])

    started = [TfWorker(portpicker.pick_unused_port()).start() for _ in range(workers)]
    try:
        ends: list[float] = []
        sim = tfl.federated.Simulation(model_fn, clients, "fedavg", rounds=rounds, clients_per_round=8, seed=0,
                                       local_epochs=local_epochs, backend="compiled", progress=False,
                                       workers=[w.address for w in started] or None)
        sim.round_listeners.append(lambda record: ends.append(time.perf_counter()))
        sim.run()
        weights = [np.asarray(w).tolist() for w in sim.model_weights().trainable[:1]]
        params = sum(int(np.prod(np.shape(w))) for w in sim.model_weights().trainable)
        print("RESULT " + json.dumps({"steady": (rounds - 1) / (ends[-1] - ends[0]), "first_kernel": weights,
                                      "params": params}), flush=True)
    finally:
        for w in started:
            w.stop()


def run(workers: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", str(workers), "--rounds", str(args.rounds), "--hidden",
           str(args.hidden), "--local-epochs", str(args.local_epochs), "--clients", str(args.clients)]
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600,
                          env={**env, "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"the run with {workers} workers failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--workers", default="1,2,4", help="Comma-separated worker counts to compare.")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--clients", type=int, default=100, help="Clients the digits are split into (fewer: more "
                        "examples, so more local work, each).")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error(f"--rounds must be at least 3. Received: {args.rounds}")
    if args.child is not None:
        child(args.child, args.rounds, args.hidden, args.local_epochs, args.clients)
        return
    counts = [0] + [int(n) for n in args.workers.split(",") if n.strip()]
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    print(f"compiled rounds on TensorFlow workers: digits, {args.clients} clients, 8 per round, MLP {args.hidden}x2, "
          f"{args.local_epochs} local epochs, {args.rounds} rounds, {args.repeats} alternating repeats", flush=True)
    for rep in range(args.repeats):
        for n in (counts if rep % 2 == 0 else counts[::-1]):
            runs[n].append(run(n, args))
            label = "one process" if n == 0 else f"{n} workers"
            print(f"repeat {rep + 1}: {label:12} {runs[n][-1]['steady']:7.2f} rounds/s", flush=True)
    base = float(np.median([r["steady"] for r in runs[0]]))
    reference = np.asarray(runs[0][0]["first_kernel"][0])
    print(f"model: {runs[0][0]['params']:,} weights")
    print(f"{'contender':14}{'r/s (median)':>14}{'ratio':>8}{'max |dw| vs one process':>26}")
    for n in counts:
        median = float(np.median([r["steady"] for r in runs[n]]))
        diff = float(np.max(np.abs(np.asarray(runs[n][0]["first_kernel"][0]) - reference)))
        label = "one process" if n == 0 else f"{n} workers"
        print(f"{label:14}{median:14.2f}{median / base:8.3f}{diff:26.2e}")


if __name__ == "__main__":
    main()
