"""SSP with k=0 (lockstep), k=2 and k=8 vs ASP on a parameter server with one straggling worker.

Digits (scikit-learn's 8x8), the ``digits_cnn`` model, SGD, 2 workers + 1 parameter server
as ``tf.distribute.Server``s in this process on 127.0.0.1, scheduled by TensorFlow's
``ClusterCoordinator`` under :mod:`tensorfleet.strategies.staleness`, measured by
:func:`tensorfleet.testing.staleness_run.train`. Worker 1 pauses inside
every step (between reading the variables and applying its update) -- the straggler. Every
policy applies each worker's update on its own; k=0 keeps the clocks in lockstep but is not BSP
(no aggregation of a clock's updates).

Per policy: steady-state steps/s, the clock gap actually seen (how far the fast worker ran
ahead), the update lag (other workers' updates landing between a step's read and its own
update), test accuracy at the end, and the wall time to 90% test accuracy (counted from
the end of the warm-up, when every worker has finished its first, tracing, step). The policies are
alternated within each repetition; medians over the repetitions are reported. A PNG shows
test accuracy against wall-clock time.

Run: ``.venv/bin/python bench/consistency_straggler.py [--steps 300] [--delay 0.03] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

POLICIES = [0, 2, 8, None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="total steps per run, over both workers")
    parser.add_argument("--delay", type=float, default=0.03, help="the straggler's pause per step, seconds")
    parser.add_argument("--every", type=int, default=1,
                        help="the straggler pauses on every n-th of its steps (1 = always)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", default="out/bench")
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    from tensorfleet.io import save_figure, write_json
    from tensorfleet.models import build, datasets
    from tensorfleet.strategies.data_parallel import parameter_server
    from tensorfleet.strategies.servers import start_in_process_cluster
    from tensorfleet.testing.staleness_run import train

    tf.get_logger().setLevel("ERROR")

    split = datasets.load_digits()
    strategy = parameter_server(cluster=start_in_process_cluster(workers=2, ps=1))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

    def dataset_fn(context: object) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((split.x_train, split.y_train)).shuffle(2000).repeat().batch(32)

    evaluator = build("digits_cnn")

    def accuracy(weights: list) -> float:
        evaluator.set_weights(weights)
        logits = evaluator(split.x_test, training=False).numpy()
        return float(np.mean(np.argmax(logits, 1) == split.y_test))

    pattern = [args.delay] + [0.0] * (args.every - 1)
    results: dict[str, list[dict]] = {}
    curves: dict[str, list[tuple[float, float]]] = {}
    print(f"# consistency models with a straggler, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores; {args.steps} steps per run, worker 1 pauses {args.delay * 1e3:.0f} ms on "
          f"every {args.every} of its steps, {args.repeats} repeats alternated\n")
    for repeat in range(args.repeats):
        for staleness in POLICIES:
            _, run = train(
                strategy, coordinator, model_fn=lambda: build("digits_cnn"),
                optimizer_fn=lambda: tf.keras.optimizers.SGD(args.lr), dataset_fn=dataset_fn, steps=args.steps,
                staleness=staleness, straggler=1, straggler_delay=pattern, snapshot_interval=0.25,
                progress=True)
            # Time counts from the end of the warm-up (every worker's first step: tracing).
            curve = [(t - run.warmup_seconds, accuracy(w)) for t, w in run.snapshots if t >= run.warmup_seconds]
            reach = next((t for t, a in curve if a >= 0.9), float("nan"))
            summary = {**run.summary(), "steps_per_worker": run.steps_per_worker(2),
                       "final_accuracy": curve[-1][1], "seconds_to_90pct": reach}
            results.setdefault(run.policy.label, []).append(summary)
            curves[run.policy.label] = curve
            print(f"repeat {repeat + 1}: {summary}")

    lines = ["| policy | steps/s | max clock gap | mean update lag | max update lag | steps (fast, straggler) "
             "| final accuracy | s to 90% |", "|---|---|---|---|---|---|---|---|"]
    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    for label, rows in results.items():
        split_steps = rows[-1]["steps_per_worker"]
        lines.append(
            f"| {label} | {med(rows, 'steps_per_second'):.1f} | {med(rows, 'max_clock_gap'):.0f} | "
            f"{med(rows, 'mean_update_lag'):.2f} | {med(rows, 'max_update_lag'):.0f} | {split_steps[0]}, "
            f"{split_steps[1]} | {med(rows, 'final_accuracy'):.3f} | {med(rows, 'seconds_to_90pct'):.2f} |")
    base = statistics.median(r["steps_per_second"] for r in results["SSP k=0"])
    print("\n" + "\n".join(lines))
    print("\nsteps/s relative to SSP k=0: " + ", ".join(
        f"{label} {statistics.median(r['steps_per_second'] for r in rows) / base:.2f}x"
        for label, rows in results.items()))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, curve in curves.items():
        left.plot([t for t, _ in curve], [a for _, a in curve], marker=".", label=label)
    left.set_xlabel("wall-clock seconds after warm-up")
    left.set_ylabel("test accuracy")
    left.set_title("Accuracy against wall-clock time (last repeat)")
    left.legend()
    labels = list(results)
    right.bar(labels, [statistics.median(r["steps_per_second"] for r in results[k]) for k in labels])
    right.set_ylabel("steps/s (median)")
    right.set_title(f"Throughput, straggler pausing {args.delay * 1e3:.0f} ms")
    os.makedirs(args.out, exist_ok=True)
    png = save_figure(fig, os.path.join(args.out, "consistency_straggler.png"))
    write_json(os.path.join(args.out, "consistency_straggler.json"), {"args": vars(args), "results": results,
                                                                       "curves": curves})
    print(f"\nplot: {png}")


if __name__ == "__main__":
    main()
