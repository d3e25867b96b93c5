"""Raw TFF against tensorfleet's Simulation: rounds/s, accuracy and memory, side by side.

100 clients of scikit-learn's digits (IID), 10 per round, the digits CNN, the same seed and the
same client sampling and example order for both:

* ``raw``: a hand-written loop over ``tff.learning.algorithms.build_weighted_fed_avg`` and
  ``process.next`` with one ``tf.data`` dataset per sampled client, on TFF's default runtime.
* ``tensorfleet``: ``Simulation(..., backend="compiled")``: the initial model from ``model_fn()``,
  every round one compiled TensorFlow function (see tensorfleet/federated/backends/compiled/engine.py),
  with TensorFlow's thread pools set by ``tfl.federated.configure_threads()`` first, as
  ``tensorfleet federated run`` sets them (one intra-op thread, an inter-op thread per lane plus one).
* ``tfl tf-pools``: the same ``Simulation`` on TensorFlow's own pools (a script that does not call
  ``configure_threads()``).

Each contender runs in its own process (so that memory is its own; the raw loop's figure adds
TFF's worker_binary child); they run one after the other in this one invocation, once per seed
(``--seeds``: the seed of the client sampling and example order). Each child first imports
TensorFlow, TFF and tensorfleet (timed: ``import s``; the raw loop needs TFF, and the compiled
backend's child imports it too, though it needs none, so that both pay the same imports), then starts its clock and
notes the end of every round. The script prints, per seed, rounds/s of both (steady: rounds 2 to ``--rounds``;
total: from its clock's start to the end of round 60, so data, building and tracing count), the
central test accuracy after round 60 and after the last (evaluated off the clock) and resident
memory after rounds 10 and ``--rounds``; then the ratios of the medians over seeds (the total also
with the imports counted), when tensorfleet's first round began and ended after ``run()``, and
each accuracy as the mean and standard deviation over seeds with the difference of the means:
both backends compute the same rounds (tests/federated/backends/test_compiled.py: equal within
1e-5 after 5 rounds), but float rounding in a different order of sums grows over tens of rounds
into a different run, as a different seed would.

Then the algorithm x aggregator matrix (fedavg, fedprox, fedsgd x mean, dp_fixed, median, krum,
compression): the same task on ``backend="compiled"`` and ``backend="tff"`` with central test
data evaluated in the last round, steady rounds/s of each (from the end of round 1 to the end of
round ``R - 1``: the first round traces, the last builds the evaluation model) and their ratio,
over ``--matrix-rounds`` rounds per cell and ``--matrix-seeds`` seeds (accuracy: the mean).

It compares against TFF, so it runs on the tff track (``.venv-tff/bin/python``). With
``--current-python .venv/bin/python`` tensorfleet's contenders (the classic ``tensorfleet`` and ``tf-pools``,
the matrix's compiled cells) run on that interpreter instead, the current track's TensorFlow 2.21, while
raw TFF and the tff backend stay on the tff track: the two tracks side by side in one run.

``--against DIR`` compares the compiled cells of the matrix with those of another checkout of
tensorfleet (a ``git worktree`` of an earlier commit) instead: each side's cells run in a process of
their own, the two sides alternating (after, before, before, after, ...) ``--repeats`` times, and
the script prints each cell's median steady rounds/s of both and their ratio (after / before), and
the geometric mean of the ratios. It needs no TFF.

``--only keras`` runs the digits CNN built in Keras 3 beside the same model built in tf_keras (the zoo's twins), on
the compiled backend in the current track's interpreter (``--current-python``, or the one running the script), each
run in a process of its own, the two alternating ``--repeats`` times; it prints the ratio of the median steady
rounds/s (Keras 3 / tf_keras). It needs no TFF.

Run with ``python bench/federated_speed.py [--rounds 200] [--seeds 3] [--matrix-rounds 20] [--matrix-seeds 1]
[--matrix-pools cli|tensorflow] [--only classic|matrix|keras] [--current-python PATH] [--against DIR [--repeats 4]]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
NUM_CLIENTS, PER_ROUND, SEED, BATCH = 100, 10, 0, 20
ACCURACY_ROUND = 60  # the issue's bench task: accuracy after 60 rounds (and after the last)


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


def _accuracy(weights: Any, split: Any) -> float:
    """Central test accuracy of the digits CNN holding ``weights`` (a ``tff.learning.models.ModelWeights``)."""
    import numpy as np

    import tensorfleet as tfl

    model = tfl.models.build("digits_cnn")
    weights.assign_weights_to(model)
    return float(np.mean(model(split.x_test).numpy().argmax(-1) == split.y_test))


class _RoundLog:
    """What both contenders note at the end of each round: its time on the clock started at ``start``,
    resident memory after rounds 10 and the last, and test accuracy after rounds 60 and the last,
    evaluated off the clock (its time moves the clock's start)."""

    def __init__(self, start: float, rounds: int, split: Any) -> None:
        self.start, self.rounds, self.split = start, rounds, split
        self.out: dict = {"rss_mb": {}, "times": [], "accuracy": {}}

    def note(self, r: int, weights: Any) -> None:
        self.out["times"].append(time.perf_counter() - self.start)
        if r in (10, self.rounds):
            self.out["rss_mb"][r] = _rss_mb(os.getpid())
        if r in (ACCURACY_ROUND, self.rounds):
            evaluated = time.perf_counter()
            self.out["accuracy"][r] = _accuracy(weights(), self.split)
            self.start += time.perf_counter() - evaluated


def contender_raw(rounds: int, seed: int = SEED) -> dict:
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
    log = _RoundLog(start, rounds, split)
    for r in range(1, rounds + 1):
        picked = sorted(np.random.default_rng([seed, r]).choice(len(ids), size=PER_ROUND, replace=False))
        data = []
        for i in picked:
            x, y = clients.arrays(ids[i])
            order = np.random.default_rng([seed, r, stable_hash(ids[i])]).permutation(len(y))
            data.append(
                tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x[order], y=y[order])).batch(BATCH))
        state = process.next(state, data).state
        log.note(r, lambda: process.get_model_weights(state))
    _stop_own_children()  # raw TFF would leave its worker_binary holding our stdout (STACK.md)
    return log.out


def _stop_own_children() -> None:
    import signal

    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue


def contender_tensorfleet(rounds: int, seed: int = SEED, keras: str | None = None) -> dict:
    """The compiled backend's run; ``keras``: the Keras the digits CNN is built in (None: this process's)."""
    import tensorfleet as tfl

    start = time.perf_counter()  # imports done (timed by _child)
    split, clients = _data()
    sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_cnn", keras=keras), clients, "fedavg",
                                   rounds=rounds,
                                   clients_per_round=PER_ROUND, seed=seed, batch_size=BATCH, progress=False,
                                   backend="compiled")
    log = _RoundLog(start, rounds, split)  # the raw loop's measurements, at the same rounds
    sim.round_listeners.append(lambda record: log.note(record["round"], lambda: sim.model_weights()))
    run_called = time.perf_counter() - start
    history = sim.run()
    assert len(history.rounds) == rounds
    times = log.out["times"]
    return {**log.out, "round1_begins_s": times[0] - history.rounds[0]["seconds"] - run_called,
            "round1_ends_s": times[0] - run_called}


def _child(which: str, rounds: int, seed: int) -> None:
    began = time.perf_counter()
    import tensorflow  # noqa: F401

    import tensorfleet  # noqa: F401

    if which == "raw":
        import tensorflow_federated  # noqa: F401

    imports = time.perf_counter() - began
    # as `tensorfleet federated run` does, before TensorFlow's runtime starts
    if which in ("tensorfleet", *KERAS_TWINS):
        tensorfleet.federated.configure_threads(PER_ROUND)
    if which in KERAS_TWINS:
        result = contender_tensorfleet(rounds, seed, keras=which)
    else:
        result = (contender_raw if which == "raw" else contender_tensorfleet)(rounds, seed)
    print("RESULT " + json.dumps({**result, "import_s": imports}), flush=True)


KERAS_TWINS = ("keras3", "tf_keras")


def keras_twins(rounds: int, repeats: int) -> list[str]:
    """The digits CNN built in Keras 3 and in tf_keras (the zoo's twins), each run on the compiled backend in a
    process of its own, the two alternating ``repeats`` times; prints each run's steady rounds/s (rounds 2 to
    ``rounds``) and the ratio of the medians (Keras 3 / tf_keras), and the test accuracy after the last round."""
    import numpy as np

    steady: dict[str, list[float]] = {k: [] for k in KERAS_TWINS}
    accuracy: dict[str, list[float]] = {k: [] for k in KERAS_TWINS}
    lines = [f"Keras 3 against tf_keras on the compiled backend: digits CNN, {NUM_CLIENTS} clients, {PER_ROUND} per "
             f"round, {rounds} rounds, seed {SEED}, {repeats} alternating runs each, interpreter "
             f"{_python('tensorfleet')}",
             f"{'run':>4} {'keras':10}{'r/s steady':>11}{f'acc r{rounds}':>10}"]
    print("\n".join(lines), flush=True)
    for rep in range(repeats):
        for keras in (KERAS_TWINS if rep % 2 == 0 else KERAS_TWINS[::-1]):
            out = _run_child(keras, rounds, SEED)
            times = out["times"]
            steady[keras].append((rounds - 1) / (times[-1] - times[0]))
            accuracy[keras].append(out["accuracy"][str(rounds)])
            lines.append(f"{rep + 1:>4} {keras:10}{steady[keras][-1]:11.2f}{accuracy[keras][-1]:10.4f}")
            print(lines[-1], flush=True)
    median = {k: float(np.median(v)) for k, v in steady.items()}
    lines.append(f"median steady r/s: keras3 {median['keras3']:.2f}, tf_keras {median['tf_keras']:.2f}; "
                 f"ratio keras3/tf_keras {median['keras3'] / median['tf_keras']:.3f} (target >= 0.95)")
    print(lines[-1], flush=True)
    return lines


MATRIX_ALGORITHMS = ("fedavg", "fedprox", "fedsgd")
MATRIX_AGGREGATORS = {"mean": {}, "dp_fixed": {"noise_multiplier": 0.1, "clip": 1.0}, "median": {},
                      "krum": {"num_byzantine": 1}, "compression": {"bits": 8, "sparsity": 0.5}}


def matrix_cell(algorithm: str, aggregator: str, backend: str, rounds: int, seed: int = SEED) -> dict:
    """Steady rounds/s (from the end of round 1 to the end of round ``rounds - 1``; the last round
    evaluates) and seconds to the end of round 1 of one cell on one backend."""
    import tensorfleet as tfl

    split, clients = _data()
    ends: list = []
    start = time.perf_counter()
    sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_cnn"), clients, algorithm, rounds=rounds,
                                   clients_per_round=PER_ROUND, seed=seed, batch_size=BATCH, progress=False,
                                   backend=backend, aggregator=None if aggregator == "mean" else aggregator,
                                   aggregator_options=MATRIX_AGGREGATORS[aggregator],
                                   test_data=(split.x_test, split.y_test), eval_every=rounds)
    sim.round_listeners.append(lambda record: ends.append(time.perf_counter()))
    sim.run()
    return {"steady_rounds_per_s": (rounds - 2) / (ends[-2] - ends[0]), "first_round_end_s": ends[0] - start,
            "accuracy": sim.history.final("test_accuracy")}


def cells_child(spec: str, rounds: int, seeds: int) -> None:
    """A child's part of the matrix: ``spec`` is ``BACKEND/ALG:AGG,ALG:AGG,...``; prints ``CELL`` and the cell's
    runs (one per seed) as JSON, cell by cell. The compiled backend runs on the pools that ``tensorfleet federated
    run`` sets unless ``BACKEND`` is ``compiled-tf-pools``."""
    import tensorfleet as tfl

    print(f"tensorfleet from {Path(tfl.__file__).parent.parent}", file=sys.stderr, flush=True)
    backend, _, cells = spec.partition("/")
    if backend == "compiled":
        tfl.federated.configure_threads(PER_ROUND)
    for cell in cells.split(","):
        algorithm, aggregator = cell.split(":")
        runs = [matrix_cell(algorithm, aggregator, backend.removesuffix("-tf-pools"), rounds, seed)
                for seed in range(SEED, SEED + seeds)]
        print("CELL " + json.dumps({"cell": cell, "runs": runs}), flush=True)


# The interpreter of tensorfleet's contenders (--current-python); raw TFF and the tff backend use sys.executable.
CURRENT_PYTHON: list[str] = [sys.executable]


def _python(which: str) -> str:
    """The interpreter of a contender: raw TFF and the tff backend on this one, tensorfleet's on --current-python."""
    return sys.executable if which in ("raw", "tff") else CURRENT_PYTHON[0]


def _cells(backend: str, cells: list[str], rounds: int, seeds: int, env: dict | None = None,
           root: Path = ROOT) -> Any:
    """Yields ``(cell, runs)`` as one child process of ``backend`` (running the tensorfleet of ``root``)
    finishes each cell."""
    cmd = [_python(backend), __file__, "--child", "cells", "--cell", f"{backend}/{','.join(cells)}",
           "--matrix-rounds", str(rounds), "--matrix-seeds", str(seeds), "--root", str(root)]
    # The child's stderr (TensorFlow's and TFF's logs) goes to a file: a pipe read only at the end could fill
    # up and stop the child while this reads its stdout.
    with tempfile.TemporaryFile("w+") as errors, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(root), **(env or {})}) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("CELL "):
                done = json.loads(line[5:])
                yield done["cell"], done["runs"]
        if proc.wait() != 0:
            errors.seek(0)
            sys.exit(f"the {backend} cells failed (exit {proc.returncode}):\n{errors.read()[-3000:]}")


def run_against(before: Path, rounds: int, seeds: int, repeats: int) -> list[str]:
    """The compiled cells of this checkout against those of ``before``, alternating sides ``repeats`` times."""
    import numpy as np

    cells = [f"{a}:{g}" for a in MATRIX_ALGORITHMS for g in MATRIX_AGGREGATORS]
    steady: dict[str, dict[str, list[float]]] = {"after": {}, "before": {}}
    for rep in range(repeats):
        for side in (("after", "before") if rep % 2 == 0 else ("before", "after")):
            root = ROOT if side == "after" else before
            for cell, runs in _cells("compiled", cells, rounds, seeds, root=root):
                steady[side].setdefault(cell, []).extend(r["steady_rounds_per_s"] for r in runs)
            print(f"repeat {rep + 1}/{repeats}: {side} done", flush=True)
    lines = [f"compiled matrix, this checkout ({ROOT}) against {before}: digits CNN, {NUM_CLIENTS} clients, "
             f"{PER_ROUND} per round, {rounds} rounds per cell, {repeats} alternating runs per side (medians)",
             f"{'cell':26}{'after r/s':>11}{'before r/s':>12}{'ratio':>8}"]
    ratios = []
    for cell in cells:
        after, prior = (float(np.median(steady[side][cell])) for side in ("after", "before"))
        ratios.append(after / prior)
        lines.append(f"{cell.replace(':', ' x '):26}{after:11.2f}{prior:12.2f}{after / prior:8.3f}")
    lines.append(f"geometric mean of the ratios: {float(np.exp(np.mean(np.log(ratios)))):.3f} "
                 f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    print("\n".join(lines), flush=True)
    return lines


def run_matrix(rounds: int, seeds: int = 1, compiled: str = "compiled") -> list[str]:
    """The matrix's lines: one per cell, compiled against the tff backend (rounds/s and round 1: medians over the
    seeds; accuracy: mean over the seeds, and the difference of the means). Each backend's cells run in one child
    process of their own, so that the compiled backend's thread pools are set as ``tensorfleet federated run`` sets
    them (``compiled``: ``compiled``) or left to TensorFlow (``compiled-tf-pools``)."""
    import numpy as np

    pools = "pools set as the CLI sets them" if compiled == "compiled" else "TensorFlow's own pools"
    lines = [f"algorithm x aggregator, digits CNN, {NUM_CLIENTS} clients, {PER_ROUND} per round, {rounds} rounds "
             f"per cell, seeds {SEED}..{SEED + seeds - 1} (steady rounds/s from the end of round 1 to the end of round "
             f"{rounds - 1}; s from Simulation() to the end of round 1; test accuracy after round {rounds}); "
             f"compiled on {pools}",
             f"{'cell':26}{'compiled r/s':>13}{'tff r/s':>9}{'ratio':>8}{'compiled 1st':>14}{'tff 1st':>9}"
             f"{'acc compiled':>14}{'acc tff':>9}{'diff pts':>9}"]
    print("\n".join(lines), flush=True)
    cells = [f"{a}:{g}" for a in MATRIX_ALGORITHMS for g in MATRIX_AGGREGATORS]
    fast_runs = dict(_cells(compiled, cells, rounds, seeds))
    for cell, slow_runs in _cells("tff", cells, rounds, seeds):
        runs = {"compiled": fast_runs[cell], "tff": slow_runs}
        med = {b: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for b, rs in runs.items()}
        acc = {b: float(np.mean([r["accuracy"] for r in rs])) for b, rs in runs.items()}
        fast, slow = med["compiled"], med["tff"]
        lines.append(f"{cell.replace(':', ' x '):26}{fast['steady_rounds_per_s']:13.2f}"
                     f"{slow['steady_rounds_per_s']:9.2f}"
                     f"{fast['steady_rounds_per_s'] / slow['steady_rounds_per_s']:7.1f}x"
                     f"{fast['first_round_end_s']:14.2f}{slow['first_round_end_s']:9.2f}"
                     f"{acc['compiled']:14.4f}{acc['tff']:9.4f}{100 * (acc['compiled'] - acc['tff']):+9.2f}")
        print(lines[-1], flush=True)
    return lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3, help="Seeds of the classic comparison (its accuracy is "
                        "compared per seed and as the mean over seeds).")
    parser.add_argument("--matrix-rounds", type=int, default=20)
    parser.add_argument("--matrix-seeds", type=int, default=1, help="Seeds per matrix cell (accuracy: their mean).")
    parser.add_argument("--only", choices=["classic", "matrix", "keras"], help="Run only the classic comparison, the "
                        "matrix, or the Keras 3 / tf_keras twins (on --current-python, or this interpreter).")
    parser.add_argument("--matrix-pools", choices=["cli", "tensorflow"], default="cli",
                        help="The compiled cells' thread pools: as `tensorfleet federated run` sets them (cli, "
                        "default) or TensorFlow's own.")
    parser.add_argument("--control", metavar="CELLS", help="Comma-separated matrix cells (e.g. fedsgd:compression) "
                        "whose accuracy to compare between the tff backend on oneDNN's kernels and on TensorFlow's own "
                        "(TF_ENABLE_ONEDNN_OPTS=0): the same computation in another float rounding, for --matrix-seeds "
                        "seeds; runs instead of the classic comparison and the matrix.")
    parser.add_argument("--current-python", metavar="PATH", help="Interpreter of tensorfleet's contenders (e.g. "
                        ".venv/bin/python, the current track); raw TFF and the tff backend run on this one.")
    parser.add_argument("--against", metavar="DIR", help="Another checkout of tensorfleet (e.g. a git worktree of an "
                        "earlier commit): compare the matrix's compiled cells of this one against it, side by side.")
    parser.add_argument("--repeats", type=int, default=4, help="Alternating runs per side with --against.")
    parser.add_argument("--child", choices=["raw", "tensorfleet", "tf-pools", "cells", *KERAS_TWINS],
                        help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=SEED, help=argparse.SUPPRESS)
    return parser


# The least value of each count, checked in this order.
_MINIMUMS = {"matrix_rounds": 3, "rounds": ACCURACY_ROUND, "seeds": 1, "matrix_seeds": 1}


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.current_python and not Path(args.current_python).is_file():
        parser.error(f"--current-python must name an interpreter. Received: {args.current_python}")
    for name, least in _MINIMUMS.items():
        if getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')} must be at least {least}. Received: {getattr(args, name)}")


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Runs what the options ask for: a child's part, the comparison against another checkout, the control, the
    Keras twins, or the classic comparison and the matrix."""
    if args.child == "cells":
        cells_child(args.cell, args.matrix_rounds, args.matrix_seeds)
        return
    if args.against:
        if not (Path(args.against) / "tensorfleet" / "__init__.py").is_file():
            parser.error(f"--against must name a checkout of tensorfleet. Received: {args.against}")
        run_against(Path(args.against).resolve(), args.matrix_rounds, args.matrix_seeds, args.repeats)
        return
    if args.child:
        _child(args.child, args.rounds, args.seed)
        return
    if args.control:
        control(args.control, args.matrix_rounds, args.matrix_seeds)
        return
    if args.only == "keras":
        keras_twins(args.rounds, args.repeats)
        return
    if args.only != "matrix":
        classic(args.rounds, args.seeds)
    if args.only != "classic":
        run_matrix(args.matrix_rounds, args.matrix_seeds,
                   "compiled" if args.matrix_pools == "cli" else "compiled-tf-pools")


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    _check(parser, args)
    if args.current_python:
        CURRENT_PYTHON[0] = args.current_python
    if args.root:  # the checkout whose tensorfleet a child imports (before an installed one)
        sys.path.insert(0, args.root)
    _run(parser, args)


def _run_child(which: str, rounds: int, seed: int, *extra: str, env: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run([_python(which), __file__, "--rounds", str(rounds), "--child", which, "--seed", str(seed),
                           *extra], capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
    line = [text for text in proc.stdout.splitlines() if text.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        sys.exit(f"{which} (seed {seed}) failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def classic(rounds: int, seeds: int) -> None:
    """Raw TFF against tensorfleet's compiled backend, each in its own process, for each seed."""
    import numpy as np

    print(f"federated speed: digits CNN, {NUM_CLIENTS} clients, {PER_ROUND} per round, {rounds} rounds, seeds "
          f"{SEED}..{SEED + seeds - 1} (steady: rounds 2-{rounds}; total: start to the end of round {ACCURACY_ROUND}, "
          f"imports aside; accuracy: central test data after rounds {ACCURACY_ROUND} and {rounds})", flush=True)
    print(f"interpreters: raw TFF {_python('raw')}; tensorfleet {_python('tensorfleet')}", flush=True)
    print(f"{'seed':>4} {'contender':12}{'r/s steady':>11}{'r/s total':>10}{f'acc r{ACCURACY_ROUND}':>9}"
          f"{f'acc r{rounds}':>10}{'RSS r10 MB':>11}{f'RSS r{rounds} MB':>12}{'import s':>9}", flush=True)
    runs: dict = {"raw": [], "tensorfleet": [], "tf-pools": []}
    for seed in range(SEED, SEED + seeds):
        for which in runs:
            res = _run_child(which, rounds, seed)
            times = res["times"]
            res["steady"] = (rounds - 1) / (times[-1] - times[0])
            res["total"] = ACCURACY_ROUND / times[ACCURACY_ROUND - 1]
            res["with_imports"] = ACCURACY_ROUND / (times[ACCURACY_ROUND - 1] + res["import_s"])
            runs[which].append(res)
            acc = res["accuracy"]
            print(f"{seed:4} {which:12}{res['steady']:11.2f}{res['total']:10.2f}{acc[str(ACCURACY_ROUND)]:9.4f}"
                  f"{acc[str(rounds)]:10.4f}{res['rss_mb']['10']:11.0f}{res['rss_mb'][str(rounds)]:12.0f}"
                  f"{res['import_s']:9.2f}", flush=True)

    def median(which: str, key: str) -> float:
        return float(np.median([r[key] for r in runs[which]]))

    raw, fast = runs["raw"], runs["tensorfleet"]
    for which in ("tensorfleet", "tf-pools"):
        per_seed = ", ".join(f"{f['steady'] / r['steady']:.1f}x" for r, f in zip(raw, runs[which]))
        print(f"ratio {which}/raw (medians over seeds), steady rounds/s: "
              f"{median(which, 'steady') / median('raw', 'steady'):.1f}x (per seed: "
              f"{per_seed}); including start-up over "
              f"{ACCURACY_ROUND} rounds: {median(which, 'total') / median('raw', 'total'):.1f}x "
              f"({median(which, 'with_imports') / median('raw', 'with_imports'):.1f}x with the imports of TF and TFF "
              f"counted too)")
    print(f"tensorfleet start-up: round 1 began {median('tensorfleet', 'round1_begins_s'):.2f} s after run(), ended "
          f"{median('tensorfleet', 'round1_ends_s'):.2f} s after it (medians)")
    for r in dict.fromkeys((str(ACCURACY_ROUND), str(rounds))):  # (once when --rounds is 60)
        a_raw, a_fast = (np.array([x["accuracy"][r] for x in runs[w]]) for w in ("raw", "tensorfleet"))
        print(f"accuracy after round {r}: raw TFF {a_raw.mean():.4f} +- {a_raw.std():.4f}, tensorfleet "
              f"{a_fast.mean():.4f} +- {a_fast.std():.4f} (mean +- sd over seeds); difference of the means "
              f"{100 * (a_fast.mean() - a_raw.mean()):+.2f} points, per seed "
              f"{', '.join(f'{100 * d:+.2f}' for d in a_fast - a_raw)}")
    for name, res in (("raw TFF", raw), ("tensorfleet", fast)):
        growth = [100 * (x["rss_mb"][str(rounds)] / x["rss_mb"]["10"] - 1) for x in res]
        print(f"memory growth round 10 -> {rounds}, {name}: {', '.join(f'{g:+.1f}%' for g in growth)}")


def control(cells: str, rounds: int, seeds: int) -> None:
    """Accuracy of matrix cells on the tff backend with oneDNN's kernels and with TensorFlow's own, per seed:
    how far float rounding alone moves a run (each in its own process, as the switch is read at import)."""
    import numpy as np

    print(f"control: the tff backend with oneDNN's kernels (TF_ENABLE_ONEDNN_OPTS=1) and TensorFlow's own (=0), "
          f"{rounds} rounds, seeds {SEED}..{SEED + seeds - 1}; test accuracy after round {rounds}")
    print(f"{'cell':26}{'seed':>5}{'oneDNN':>9}{'own':>9}{'diff pts':>10}")
    for cell in cells.split(","):
        algorithm, aggregator = cell.split(":")
        if algorithm not in MATRIX_ALGORITHMS or aggregator not in MATRIX_AGGREGATORS:
            sys.exit(f"--control takes cells algorithm:aggregator of {MATRIX_ALGORITHMS} x "
                     f"{tuple(MATRIX_AGGREGATORS)}. Received: {cell!r}")
        diffs = []
        (_, one_dnn), = _cells("tff", [cell], rounds, seeds, env={"TF_ENABLE_ONEDNN_OPTS": "1"})
        (_, own), = _cells("tff", [cell], rounds, seeds, env={"TF_ENABLE_ONEDNN_OPTS": "0"})
        for seed, a, b in zip(range(SEED, SEED + seeds), one_dnn, own):
            diffs.append(100 * (a["accuracy"] - b["accuracy"]))
            print(f"{algorithm + ' x ' + aggregator:26}{seed:5}{a['accuracy']:9.4f}{b['accuracy']:9.4f}"
                  f"{diffs[-1]:+10.2f}", flush=True)
        print(f"{algorithm + ' x ' + aggregator:26} mean |diff| {np.mean(np.abs(diffs)):.2f} points", flush=True)


if __name__ == "__main__":
    main()
