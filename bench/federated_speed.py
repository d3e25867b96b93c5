"""Raw TFF against tensorfleet's Simulation: rounds/s, accuracy and memory, side by side.

100 clients of scikit-learn's digits (IID), 10 per round, the digits CNN, the same seed and the
same client sampling and example order for both:

* ``raw``: a hand-written loop over ``tff.learning.algorithms.build_weighted_fed_avg`` and
  ``process.next`` with one ``tf.data`` dataset per sampled client, on TFF's default runtime.
* ``tensorfleet``: ``Simulation(..., backend="compiled")``: the initial model from ``model_fn()``,
  every round one compiled TensorFlow function (see tensorfleet/federated/backends/compiled.py).

Each contender runs in its own process (so that memory is its own; the raw loop's figure adds
TFF's worker_binary child); they run one after the other in this one invocation. Each child
first imports TensorFlow, TFF and tensorfleet (timed: ``import s``; both need TFF, the compiled
backend because ``partition()``'s client data is a TFF ``ClientData``), then starts its clock:
"total" counts data, building, tracing and all rounds from the same point in both. The script
prints rounds/s of both (steady state, after the first round, and total; the ratio of totals
also with the imports counted), the final central test accuracy of both, resident memory after
rounds 10 and ``--rounds``, and when tensorfleet's first round began and ended after ``run()``.

Then the algorithm x aggregator matrix (fedavg, fedprox, fedsgd x mean, dp_fixed, median, krum,
compression): the same task on ``backend="compiled"`` and ``backend="tff"`` with central test
data evaluated in the last round, steady rounds/s of each (from the end of round 1 to the end of
round ``R - 1``: the first round traces, the last builds the evaluation model) and their ratio,
over ``--matrix-rounds`` rounds per cell.

Run with ``python bench/federated_speed.py [--rounds 200] [--matrix-rounds 20] [--only classic|matrix]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
NUM_CLIENTS, PER_ROUND, SEED, BATCH = 100, 10, 0, 20


def _rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its children (TFF's worker), in MB, from /proc."""
    total = 0.0
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                pids.append(int(entry.name))
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


def _data():
    import tensorfleet as tfl

    split = tfl.models.datasets.load_digits()
    clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=NUM_CLIENTS, scheme="iid", seed=SEED)
    return split, clients


def contender_raw(rounds: int) -> dict:
    import collections

    import numpy as np
    import tensorflow as tf
    import tensorflow_federated as tff

    import tensorfleet as tfl
    from tensorfleet.federated.sampling import stable_hash

    start = time.perf_counter()  # imports done (timed by _child)
    split, clients = _data()
    ids = clients.client_ids
    spec = collections.OrderedDict(x=tf.TensorSpec([None, 8, 8, 1], tf.float32), y=tf.TensorSpec([None], tf.int32))

    def model_fn():
        return tff.learning.models.from_keras_model(
            tfl.models.build("digits_cnn"), input_spec=spec,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

    process = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
    state = process.initialize()
    out = {"rss_mb": {}}
    t_first = None
    for r in range(1, rounds + 1):
        picked = sorted(np.random.default_rng([SEED, r]).choice(len(ids), size=PER_ROUND, replace=False))
        data = []
        for i in picked:
            x, y = clients.arrays(ids[i])
            order = np.random.default_rng([SEED, r, stable_hash(ids[i])]).permutation(len(y))
            data.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x[order], y=y[order])).batch(BATCH))
        state = process.next(state, data).state
        if r == 1:
            t_first = time.perf_counter()
        if r in (10, rounds):
            out["rss_mb"][r] = _rss_mb(os.getpid())
    end = time.perf_counter()
    model = tfl.models.build("digits_cnn")
    process.get_model_weights(state).assign_weights_to(model)
    logits = model(split.x_test).numpy()
    out.update(accuracy=float(np.mean(logits.argmax(-1) == split.y_test)),
               steady_rounds_per_s=(rounds - 1) / (end - t_first), total_rounds_per_s=rounds / (end - start))
    _stop_own_children()  # raw TFF would leave its worker_binary holding our stdout (STACK.md)
    return out


def _stop_own_children() -> None:
    import signal

    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue


def contender_tensorfleet(rounds: int, on_round: Any = None) -> dict:
    import numpy as np

    import tensorfleet as tfl

    start = time.perf_counter()  # imports done (timed by _child)
    split, clients = _data()
    sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_cnn"), clients, "fedavg", rounds=rounds,
                                   clients_per_round=PER_ROUND, seed=SEED, batch_size=BATCH, progress=False,
                                   backend="compiled")
    if on_round is not None:
        sim.round_listeners.append(on_round)
    run_called = time.perf_counter()
    history = sim.run()
    end = time.perf_counter()
    assert len(history.rounds) == rounds
    steady = sim_times[rounds] - sim_times[1]  # wall time from the end of round 1 to the end of the last
    model = tfl.models.build("digits_cnn")
    sim.weights.assign_weights_to(model)
    logits = model(split.x_test).numpy()
    first_end = sim_times[1] - run_called
    return {"accuracy": float(np.mean(logits.argmax(-1) == split.y_test)), "steady_rounds_per_s": (rounds - 1) / steady,
            "total_rounds_per_s": rounds / (end - start), "rss_mb": sim_rss,
            "round1_begins_s": first_end - history.rounds[0]["seconds"], "round1_ends_s": first_end}


sim_rss: dict = {}
sim_times: dict = {}


def _child(which: str, rounds: int) -> None:
    began = time.perf_counter()
    import tensorflow  # noqa: F401
    import tensorflow_federated  # noqa: F401

    import tensorfleet  # noqa: F401

    imports = time.perf_counter() - began
    result = _run_tensorfleet_with_rss(rounds) if which == "tensorfleet" else contender_raw(rounds)
    print("RESULT " + json.dumps({**result, "import_s": imports}), flush=True)


def _run_tensorfleet_with_rss(rounds: int) -> dict:
    def rss_and_time(record: dict) -> None:  # RSS at the same rounds as the raw loop
        if record["round"] in (10, rounds):
            sim_rss[record["round"]] = _rss_mb(os.getpid())
        sim_times[record["round"]] = time.perf_counter()

    return contender_tensorfleet(rounds, on_round=rss_and_time)


MATRIX_ALGORITHMS = ("fedavg", "fedprox", "fedsgd")
MATRIX_AGGREGATORS = {"mean": {}, "dp_fixed": {"noise_multiplier": 0.1, "clip": 1.0}, "median": {},
                      "krum": {"num_byzantine": 1}, "compression": {"bits": 8, "sparsity": 0.5}}


def matrix_cell(algorithm: str, aggregator: str, backend: str, rounds: int) -> dict:
    """Steady rounds/s (from the end of round 1 to the end of round ``rounds - 1``; the last round
    evaluates) and seconds to the end of round 1 of one cell on one backend."""
    import tensorfleet as tfl

    split, clients = _data()
    ends: list = []
    start = time.perf_counter()
    sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_cnn"), clients, algorithm, rounds=rounds,
                                   clients_per_round=PER_ROUND, seed=SEED, batch_size=BATCH, progress=False,
                                   backend=backend, aggregator=None if aggregator == "mean" else aggregator,
                                   aggregator_options=MATRIX_AGGREGATORS[aggregator],
                                   test_data=(split.x_test, split.y_test), eval_every=rounds)
    sim.round_listeners.append(lambda record: ends.append(time.perf_counter()))
    sim.run()
    return {"steady_rounds_per_s": (rounds - 2) / (ends[-2] - ends[0]), "first_round_end_s": ends[0] - start,
            "accuracy": sim.history.final("test_accuracy")}


def run_matrix(rounds: int) -> list[str]:
    """The matrix's lines: one per cell, compiled against the tff backend."""
    lines = [f"algorithm x aggregator, digits CNN, {NUM_CLIENTS} clients, {PER_ROUND} per round, {rounds} rounds "
             f"per cell (steady rounds/s from the end of round 1 to the end of round {rounds - 1}; s from "
             f"Simulation() to the end of round 1; test accuracy after round {rounds})",
             f"{'cell':26}{'compiled r/s':>13}{'tff r/s':>9}{'ratio':>8}{'compiled 1st':>14}{'tff 1st':>9}"
             f"{'acc compiled':>14}{'acc tff':>9}"]
    print("\n".join(lines), flush=True)
    for algorithm in MATRIX_ALGORITHMS:
        for aggregator in MATRIX_AGGREGATORS:
            res = {b: matrix_cell(algorithm, aggregator, b, rounds) for b in ("compiled", "tff")}
            fast, slow = res["compiled"], res["tff"]
            lines.append(f"{algorithm + ' x ' + aggregator:26}{fast['steady_rounds_per_s']:13.2f}"
                         f"{slow['steady_rounds_per_s']:9.2f}"
                         f"{fast['steady_rounds_per_s'] / slow['steady_rounds_per_s']:7.1f}x"
                         f"{fast['first_round_end_s']:14.2f}{slow['first_round_end_s']:9.2f}"
                         f"{fast['accuracy']:14.4f}{slow['accuracy']:9.4f}")
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--matrix-rounds", type=int, default=20)
    parser.add_argument("--only", choices=["classic", "matrix"], help="Run only the classic comparison or the matrix.")
    parser.add_argument("--child", choices=["raw", "tensorfleet"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.matrix_rounds < 3:
        parser.error(f"--matrix-rounds must be at least 3. Received: {args.matrix_rounds}")
    if args.rounds < 10:
        parser.error(f"--rounds must be at least 10. Received: {args.rounds}")
    if args.child:
        _child(args.child, args.rounds)
        return
    if args.only != "matrix":
        classic(args.rounds)
    if args.only != "classic":
        run_matrix(args.matrix_rounds)


def classic(rounds: int) -> None:
    """Raw TFF against tensorfleet's compiled backend, each in its own process."""
    results = {}
    for which in ("raw", "tensorfleet"):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, __file__, "--rounds", str(rounds), "--child", which],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
        line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            sys.exit(f"{which} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        results[which] = json.loads(line[-1][7:])
    raw, fast = results["raw"], results["tensorfleet"]
    r_last = str(rounds)
    print(f"federated speed: digits CNN, {NUM_CLIENTS} clients, {PER_ROUND} per round, {rounds} rounds, seed {SEED}")
    print(f"{'':13}{'rounds/s steady':>17}{'rounds/s total':>16}{'test acc':>10}{'RSS r10 MB':>12}{f'RSS r{r_last} MB':>14}"
          f"{'import s':>10}")
    for name, res in (("raw TFF", raw), ("tensorfleet", fast)):
        print(f"{name:13}{res['steady_rounds_per_s']:17.2f}{res['total_rounds_per_s']:16.2f}{res['accuracy']:10.4f}"
              f"{res['rss_mb']['10']:12.0f}{res['rss_mb'][r_last]:14.0f}{res['import_s']:10.2f}")
    with_imports = {name: rounds / (rounds / res["total_rounds_per_s"] + res["import_s"])
                    for name, res in (("raw", raw), ("fast", fast))}
    print(f"ratio tensorfleet/raw, steady rounds/s: {fast['steady_rounds_per_s'] / raw['steady_rounds_per_s']:.1f}x; "
          f"including start-up: {fast['total_rounds_per_s'] / raw['total_rounds_per_s']:.1f}x "
          f"({with_imports['fast'] / with_imports['raw']:.1f}x with the imports of TF and TFF counted too)")
    print(f"tensorfleet start-up: round 1 began {fast['round1_begins_s']:.2f} s after run(), ended "
          f"{fast['round1_ends_s']:.2f} s after it")
    print(f"accuracy difference: {100 * (fast['accuracy'] - raw['accuracy']):+.2f} points")
    for name, res in (("raw TFF", raw), ("tensorfleet", fast)):
        growth = 100 * (res['rss_mb'][r_last] / res['rss_mb']['10'] - 1)
        print(f"memory growth round 10 -> {r_last}, {name}: {growth:+.1f}%")


if __name__ == "__main__":
    main()
