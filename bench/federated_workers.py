"""Federated simulation on 1 vs 2 TFF worker processes, and 100 vs 3,400 lazy clients.

1. Speed: the same simulation (digits, 100 clients, 10 per round, a small MLP, same seed) with
   ``workers=[one]`` and ``workers=[one, two]`` (TFF's mergeable context over real
   ``worker_binary`` processes on 127.0.0.1), alternated REPS times in one run. Rounds/s is the
   median over rounds 2.. of each run (round 1 compiles); prints both, the ratio, and the largest
   weight difference between the two (they must agree within 1e-6).
2. Memory: EMNIST-shaped lazy clients (``emnist_like_clients``, 20 examples each, 10 per
   round), 100 vs 3,400 clients, each simulation in a fresh process: resident memory of the
   Python process and of its TFF worker after ROUNDS rounds, and their ratio (target: within
   10%). For contrast, the 3,400 clients made up front (every client's arrays in memory).

It measures TFF's workers, so it runs on the tff track.

Run: .venv-tff/bin/python bench/federated_workers.py [--reps 2] [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _mlp(input_shape: tuple[int, ...]) -> Any:
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.layers.Flatten(input_shape=input_shape),
        tf.keras.layers.Dense(32, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=0)),
        tf.keras.layers.Dense(10, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1)),
    ])


# ----------------------------------------------------------------------------- speed
def speed(reps: int, rounds: int, local_epochs: int = 1) -> dict[str, Any]:
    import numpy as np

    from tensorfleet.federated import Simulation, partition
    from tensorfleet.federated.backends.worker import Worker
    from tensorfleet.models import datasets

    split = datasets.load_digits()
    clients = partition(split.x_train, split.y_train, num_clients=100, scheme="iid", seed=0)
    workers = [Worker().start() for _ in range(2)]
    results: dict[str, list[float]] = {"1 worker": [], "2 workers": []}
    finals: dict[str, list[np.ndarray]] = {}
    try:
        for rep in range(reps):
            for label, addresses in (("1 worker", [workers[0].address]),
                                     ("2 workers", [w.address for w in workers])):
                sim = Simulation(lambda: _mlp((8, 8, 1)), clients, "fedavg", rounds=rounds, clients_per_round=10,
                                 seed=0, progress=False, workers=addresses, local_epochs=local_epochs)
                history = sim.run()
                per_round = [r["seconds"] for r in history.rounds[1:]]
                rate = 1.0 / statistics.median(per_round)
                results[label].append(rate)
                finals[label] = sim.final_weights()
                print(f"  rep {rep + 1} {label:<9} {rate:6.2f} rounds/s  (first round "
                      f"{history.rounds[0]['seconds']:.1f} s, train accuracy {history.final('train_accuracy'):.3f})",
                      flush=True)
    finally:
        for w in workers:
            w.stop()
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(finals["1 worker"], finals["2 workers"]))
    one, two = statistics.median(results["1 worker"]), statistics.median(results["2 workers"])
    # Load swings between repetitions, so the ratio is taken within each (back-to-back) pair.
    ratios = [b / a for a, b in zip(results["1 worker"], results["2 workers"])]
    return {"one": one, "two": two, "ratio": statistics.median(ratios), "ratios": ratios, "max_weight_diff": diff}


# ----------------------------------------------------------------------------- memory
def memory_child(num_clients: int, rounds: int, eager: bool) -> None:
    import collections

    import numpy as np

    from tensorfleet.federated import ArrayClientData, Simulation
    from tensorfleet.federated.clients.lazy import emnist_like_clients

    clients: Any = emnist_like_clients(num_clients, examples_per_client=20, seed=0)
    if eager:  # every client's arrays made up front, as a list of client datasets would hold them
        made = [clients.arrays(cid) for cid in clients.client_ids]
        x = np.concatenate([m[0] for m in made])
        y = np.concatenate([m[1] for m in made])
        bounds = np.cumsum([0] + [len(m[1]) for m in made])
        del made
        clients = ArrayClientData(x, y, [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])])
    sim = Simulation(lambda: _mlp((28, 28, 1)), clients, "fedavg", rounds=rounds, clients_per_round=10, seed=0,
                     progress=False, backend="tff")  # it measures TFF's worker
    t0 = time.perf_counter()
    history = sim.run(stop_worker=False)
    seconds = time.perf_counter() - t0
    worker_pid = sim.runtime.worker.pid
    out = collections.OrderedDict(
        clients=num_clients, eager=eager, python_mb=_rss_mb(), worker_mb=_rss_mb(worker_pid),
        made=len(getattr(sim.clients, "materialized", [])) if not eager else num_clients,
        seconds=seconds, train_accuracy=history.final("train_accuracy"))
    sim.runtime.stop()
    print("RESULT " + json.dumps(out), flush=True)


def memory(rounds: int) -> list[dict[str, Any]]:
    rows = []
    for num_clients, eager in ((100, False), (3400, False), (3400, True)):
        proc = subprocess.run([sys.executable, __file__, "--memory-child", str(num_clients), "--rounds", str(rounds)]
                              + (["--eager"] if eager else []), capture_output=True, text=True, timeout=900)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"memory child for {num_clients} clients failed:\n{proc.stderr[-2000:]}")
        row = json.loads(lines[-1][len("RESULT "):])
        rows.append(row)
        print(f"  {row['clients']:>5} clients {'made up front' if eager else 'lazy':<13} python "
              f"{row['python_mb']:7.1f} MB  worker {row['worker_mb']:7.1f} MB  total "
              f"{row['python_mb'] + row['worker_mb']:7.1f} MB  clients made {row['made']:>5}  {row['seconds']:.1f} s",
              flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--eager", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--local-epochs", type=int, default=1, help="more work per client per round")
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.rounds, args.eager)
        return

    print(f"federated workers, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")
    if not args.skip_speed:
        print(f"speed: digits, 100 clients, 10 per round, MLP 64-32-10, {args.local_epochs} local epoch(s), "
              f"{args.rounds} rounds, {args.reps} reps alternated; median rounds/s over rounds 2..{args.rounds}")
        s = speed(args.reps, args.rounds, args.local_epochs)
        print(f"1 worker {s['one']:.2f} rounds/s, 2 workers {s['two']:.2f} rounds/s (medians); ratio 2/1 per pair "
              f"{', '.join(f'{r:.2f}' for r in s['ratios'])}, median {s['ratio']:.2f}; "
              f"largest weight difference {s['max_weight_diff']:.2e}")
    if args.skip_memory:
        return
    print(f"memory: EMNIST-shaped lazy clients, 20 examples each, 10 per round, {args.rounds} rounds, one process each")
    rows = memory(args.rounds)
    small, large, eager = rows
    total = lambda r: r["python_mb"] + r["worker_mb"]  # noqa: E731
    print(f"3,400 vs 100 lazy clients: python {large['python_mb'] / small['python_mb']:.3f}x, "
          f"worker {large['worker_mb'] / small['worker_mb']:.3f}x, total {total(large) / total(small):.3f}x "
          f"(target within 1.10x); made up front: total {total(eager) / total(small):.3f}x")


if __name__ == "__main__":
    main()
