"""Jobs that move: the pause of a migration for a model of about 25M parameters, and the makespan of
two jobs sharing the machine by time slices against the sum of their solo runs.

One job (an MLP of ``--params`` parameters with Adam, so its checkpoint holds three copies of
the weights) is started under mirrored over one device and stopped after a few steps; it is
then continued, a few steps each, under the same placement again (the reference: a plain
restart from the checkpoint), under multi-worker mirrored over 2 workers, under a parameter
server with 2 workers and 1 ps, and under mirrored over 2 devices. The pause of a move is the
wall time from the moment the stopped job printed that it stopped (its checkpoint written) to
the first step completed after the move, and includes starting the new processes, importing
TensorFlow, building the model and restoring the checkpoint. Each pause is printed beside the
reference restart's, as a ratio, and a PNG timeline of the phases is written with ``--plot``.

Multiplexing (``--part multiplex``): two jobs (an MLP of ``--share-width`` hidden units, 4 epochs of
512 examples each, batch 32) run alone one after the other, then together with shares 0.75 / 0.25
(:func:`tensorfleet.cluster.multiplex.share`); the makespan (start to the last job's end) is
printed against the sum of the solo runs' wall times, with the shares obtained, and the
timeline goes to ``--share-plot``.

Heterogeneous workers (``--part heterogeneous``): multi-worker mirrored over 3 worker processes
whose input waits ``--delay`` seconds per example times 1, 2 and 4 (a sleep in their input
pipeline), the equal split of the global batch against batches in proportion to the measured
speeds, alternated ``--rounds`` times; throughput is examples/s after the first epoch (tracing
and the first measurements), and the accuracy after every epoch is printed for both. Then the
same under a parameter server with 3 workers (slowed alike, tf.data's sleep on the worker) and 1
ps (``--part heterogeneous-ps`` alone): the equal split there is the equal static split of every
epoch (``tensorfleet.testing.equal_shares``: rounds of one step of the global batch per worker, joined, so each worker
reads a third of the epoch once and the slowest sets the pace), against the coordinator's own
dispatch (every step on whichever worker is free) and the workers that take batches by speed with
that dispatch (:mod:`tensorfleet.cluster.ps_balance`); the examples each worker read are printed.

Example:
    python bench/jobs_that_move.py --part heterogeneous --rounds 2
    python bench/jobs_that_move.py --params 25e6 --plot docs/jobs_that_move_migration.png
    python bench/jobs_that_move.py --part multiplex --share-plot docs/jobs_that_move_multiplex.png
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JOB = '''
WIDTH = {width}


def build_model():
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(WIDTH, activation="relu"),
                                 tf.keras.layers.Dense(WIDTH, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data():
    from tensorfleet.models.datasets import load_digits

    split = load_digits(flat=True)
    return split.x_train[:512], split.y_train[:512]
'''


def _width(params: float) -> int:
    """The hidden width W of 64 -> W -> W -> 10 with about ``params`` parameters."""
    return int((-(64 + 10 + 2) + math.sqrt((64 + 10 + 2) ** 2 + 4 * params)) / 2)


def _stamp(result, pattern: str) -> float:
    for text in result.output():
        found = re.search(pattern, text)
        if found:
            return float(found.group(1))
    raise RuntimeError(f"the run's log lacks {pattern!r}:\n" + "\n".join(result.output()[-20:]))


def main(argv: list[str] | None = None) -> None:
    import tensorfleet as tfl  # noqa: F401  (first: tf.keras is tf_keras)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=25e6)
    parser.add_argument("--steps", type=int, default=2, help="steps run at each placement")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--part", choices=("all", "migration", "multiplex", "heterogeneous", "heterogeneous-ps"),
                        default="all")
    parser.add_argument("--delay", type=float, default=0.004)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--share-width", type=int, default=2048)
    parser.add_argument("--share-plot", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.part in ("all", "migration"):
        _migration(args)
    if args.part in ("all", "multiplex"):
        _multiplex(args)
    if args.part in ("all", "heterogeneous"):
        _heterogeneous(args)
    if args.part == "heterogeneous-ps":
        from tensorfleet.cluster.migration import Placement

        _heterogeneous_under(args, Placement("parameter_server", workers=3, ps=1), batch=16, splits=_PS_SPLITS)


_MWMS_SPLITS = (("equal", {}), ("by measured speed", {"balance": True}))
#: Under a parameter server the equal split is the equal static split of every epoch (rounds of one step per
#: worker, joined: each worker an equal share, each example once); the coordinator's own dispatch and the
#: balanced mode (batches by speed from a queue, with that dispatch) are measured against it.
_PS_SPLITS = (("equal shares (rounds joined)", {"equal_shares": True}), ("coordinator's dispatch", {}),
              ("by measured speed (dispatch)", {"balance": True}))


def _heterogeneous(args: argparse.Namespace) -> None:
    from tensorfleet.cluster.migration import Placement

    _heterogeneous_under(args, Placement("multi_worker_mirrored", workers=3), batch=48, splits=_MWMS_SPLITS)
    _heterogeneous_under(args, Placement("parameter_server", workers=3, ps=1), batch=16, splits=_PS_SPLITS)


def _heterogeneous_under(args: argparse.Namespace, to, *, batch: int, splits: tuple) -> None:
    import contextlib
    import statistics

    from tensorfleet import testing
    from tensorfleet.cluster.migration import RunOptions, migrate

    epochs, examples = 6, 512
    rates: dict[str, list[float]] = {name: [] for name, _ in splits}
    accuracy: dict[str, list[str]] = {}
    readers: dict[str, str] = {}
    chosen: list[str] = []
    lead = "chief:0" if to.ps else "worker:0"
    with tempfile.TemporaryDirectory(prefix="jobs-that-differ-") as scratch:
        job = Path(scratch) / "job.py"
        job.write_text(JOB.format(width=64))
        for i in range(args.rounds):
            shift = i % len(splits)  # the order rotated every round
            for k, (name, extra) in enumerate(splits[shift:] + splits[:shift]):
                options = dict(extra)
                equal = testing.equal_shares() if options.pop("equal_shares", False) else contextlib.nullcontext()
                run = RunOptions(epochs=epochs, global_batch_size=batch, **options)
                with testing.slow_inputs(args.delay, slowdown=(1.0, 2.0, 4.0)), equal:  # the benchmark's hooks
                    result = migrate(job, Path(scratch) / f"r{i}-{k}", to=to, run=run, timeout=1800)
                log = "\n".join(result.output(lead))
                begin = float(re.search(r"epoch 1/\d+ end at step \d+ at ([0-9.]+)", log).group(1))
                end = float(re.search(r"finished at step \d+ at ([0-9.]+)", log).group(1))
                rates[name].append((epochs - 1) * examples / (end - begin))
                accuracy[name] = re.findall(r"accuracy ([0-9.]+)", log)
                readers[name] = (re.findall(r"examples per worker (\[[0-9, ]+\])", log) or ["-"])[-1]
                chosen += re.findall(r"(?:replica|worker) batches (\[[0-9, ]+\])", log)[-1:]
    base = splits[0][0]
    print(f"jobs that move: heterogeneous workers, {to.describe()}, workers slowed 1x/2x/4x "
          f"({args.delay * 1000:g} ms an example times the factor), global batch {batch}"
          f"{' (a step on one worker; by speed: 3 x 16 split by speed)' if to.ps else ''}, {examples} examples, "
          f"{epochs} epochs, {args.rounds} round(s), the order rotated")
    print(f"| split | examples/s after epoch 1 (median; each run) | / {base} | accuracy after each epoch |"
          + (" examples per worker, all epochs |" if to.ps else ""))
    print("|---|---|---|---|" + ("---|" if to.ps else ""))
    for name, _ in splits:
        median = statistics.median(rates[name])
        runs = ", ".join(f"{r:.0f}" for r in rates[name])
        print(f"| {name} | {median:.0f} ({runs}) | {median / statistics.median(rates[base]):.2f}x | "
              f"{' '.join(accuracy[name])} |" + (f" {readers[name]} |" if to.ps else ""))
    last = splits[-1][0]
    print(f"throughput, {last} / {base}: {statistics.median(rates[last]) / statistics.median(rates[base]):.2f}x"
          + (f"; / {splits[1][0]}: {statistics.median(rates[last]) / statistics.median(rates[splits[1][0]]):.2f}x"
             if len(splits) > 2 else "")
          + f"; last split by speed: {', '.join(chosen)}")


def _multiplex(args: argparse.Namespace) -> None:
    from tensorfleet.cluster.migration import Placement, RunOptions, job_model, migrate
    from tensorfleet.cluster.multiplex import SharedJob, share

    run = RunOptions(epochs=4, global_batch_size=32)
    with tempfile.TemporaryDirectory(prefix="jobs-that-share-") as scratch:
        job = Path(scratch) / "job.py"
        job.write_text(JOB.format(width=args.share_width))
        job_model(job)  # this process imports TensorFlow once, before any run is timed
        solo = []
        for name in ("a", "b"):
            began = time.time()
            migrate(job, Path(scratch) / f"solo-{name}", to=Placement("mirrored"), run=run, timeout=1800)
            solo.append(time.time() - began)
        jobs = [SharedJob(job, Path(scratch) / "shared-a", Placement("mirrored"), run, share=0.75),
                SharedJob(job, Path(scratch) / "shared-b", Placement("mirrored"), run, share=0.25)]
        result = share(jobs, quantum=8, timeout=1800)
    shares = result.shares()
    print(f"jobs that move: multiplexing two jobs (MLP 64 -> {args.share_width} -> {args.share_width} -> 10, "
          f"{len(result.steps[0])} steps each), shares 0.75 / 0.25, quantum 8 steps")
    print("| measure | value |")
    print("|---|---|")
    print(f"| solo runs (s) | {solo[0]:.1f} + {solo[1]:.1f} = {sum(solo):.1f} |")
    print(f"| shared makespan (s) | {result.makespan:.1f} |")
    print(f"| makespan / sum of solo runs | {result.makespan / sum(solo):.3f} |")
    print(f"| shares of steps while both ran | {shares[0]:.3f} / {shares[1]:.3f} |")
    if args.share_plot is not None:
        result.plot(args.share_plot, names=["job a (share 0.75)", "job b (share 0.25)"])
        print(f"timeline: {args.share_plot}")


def _migration(args: argparse.Namespace) -> None:
    from tensorfleet.cluster.migration import Placement, RunOptions, migrate

    width = _width(args.params)
    phases = [("start: mirrored 1", Placement("mirrored")),
              ("restart: mirrored 1", Placement("mirrored")),
              ("mirrored 1 -> multi_worker_mirrored 2", Placement("multi_worker_mirrored", workers=2)),
              ("-> parameter_server 2 workers, 1 ps", Placement("parameter_server", workers=2, ps=1)),
              ("-> mirrored 2", Placement("mirrored", devices=2))]
    rows, spans = [], []
    with tempfile.TemporaryDirectory(prefix="jobs-that-move-") as scratch:
        job = Path(scratch) / "job.py"
        job.write_text(JOB.format(width=width))
        directory = Path(scratch) / "ckpt"
        stopped_at = None
        for i, (name, to) in enumerate(phases):
            began = time.time()
            run = RunOptions(epochs=1, global_batch_size=16, stop_at_step=(i + 1) * args.steps)
            result = migrate(job, directory, to=to, run=run, timeout=1800)
            first = _stamp(result, r"first step done at ([0-9.]+)")
            stop = _stamp(result, r"stopping at step \d+ as planned at ([0-9.]+)")
            spans.append((name, began, first, stop))
            if stopped_at is not None:
                rows.append((name, first - stopped_at))
            stopped_at = stop
        from tensorfleet.cluster.jobstate import read_state

        parameters = read_state(directory)[0].parameters
    import tensorflow as tf

    reference = rows[0][1]
    print(f"jobs that move: migration pause, {parameters:,} parameters (hidden width {width}), Adam, "
          f"TensorFlow {tf.__version__}, {args.steps} steps at each placement")
    print("| move | pause (s, stop to first step after) | vs a restart at the same placement |")
    print("|---|---|---|")
    for name, pause in rows:
        print(f"| {name} | {pause:.1f} | {pause / reference:.2f} |")
    if args.plot is not None:
        _plot(spans, args.plot, parameters)
        print(f"timeline: {args.plot}")


def _plot(spans: list, path: Path, parameters: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tensorfleet.io import save_figure

    origin = spans[0][1]
    fig, ax = plt.subplots(figsize=(9, 3))
    for row, (_, began, first, stop) in enumerate(spans):
        ax.barh(row, first - began, left=began - origin, color="lightgrey", edgecolor="black", linewidth=0.5)
        ax.barh(row, stop - first, left=first - origin, color="tab:blue", edgecolor="black", linewidth=0.5)
    ax.set_yticks(range(len(spans)), [s[0] for s in spans])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (grey: start-up, restore and first step; blue: training until the stop)")
    ax.set_title(f"a {parameters / 1e6:.1f}M-parameter job moving between placements")
    fig.tight_layout()
    save_figure(fig, path)


if __name__ == "__main__":
    main()
