"""What recording a profile costs a job outside the recorded steps.

The same Keras fit (an MLP on synthetic data, batch 64, STEPS steps) runs with and without
tensorfleet's ProfileCallback recording steps 5-9; a timer reads the clock at the end of every
step and steps/s is taken over the steps after the recording (from step 30 on), so it measures
what the job pays once the profiler is off again, plus the callback's per-step hooks. The two
contenders alternate ROUNDS times in one process on one model (in A-B, B-A order, so a drift in
the machine's load favours neither); the median of the per-round ratios is printed (target
>= 0.98), and the ratio of the best rounds. Wall time swings with whatever else the machine
runs, so the process's CPU time per step over the same steps is compared too.

Then (``--comm``) measured communication against the planner: a 2-process MultiWorkerMirrored job
(RING over gRPC on 127.0.0.1) trains an MLP of 3 sizes, each recorded with ProfileCallback
(steps 4-11) into its own directory; the communication per step measured in the trace (the least
among the workers, median over steps) is set beside the planner's ring all-reduce of the model's
gradient bytes over the link ``--latency``/``--bandwidth`` (defaults: the alpha-beta fit of
bench/collectives.py's 2-process RING on this machine, bench/RESULTS.md).

Run: .venv/bin/python bench/profile_overhead.py [--rounds 12] [--steps 400] [--comm] [--comm-only]
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

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FROM_STEP = 30
HIDDEN = (128, 512, 2048)  # MLP 256 -> h -> h -> 10: about 50K, 400K and 4.7M parameters


def run(model, data, steps: int, logdir: str | None) -> tuple[float, float, float]:
    """(steps/s from FROM_STEP on, CPU seconds per step over the same steps, seconds of steps 5-9)."""
    import tensorflow as tf

    from tensorfleet.profiling.callback import ProfileCallback

    ends: list[float] = []
    cpu: list[float] = []

    class StepClock(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True

        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())
            cpu.append(time.process_time())

    callbacks = [StepClock()] + ([ProfileCallback(logdir, steps="5-9")] if logdir else [])
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)
    counted = len(ends) - 1 - FROM_STEP
    return counted / (ends[-1] - ends[FROM_STEP]), (cpu[-1] - cpu[FROM_STEP]) / counted, ends[9] - ends[4]


def overhead(rounds: int, steps: int) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x, y = rng.random((4096, 64), dtype=np.float32), rng.integers(0, 10, 4096)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).repeat().prefetch(tf.data.AUTOTUNE)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(256, activation="relu"),
                                 tf.keras.layers.Dense(256, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    run(model, data, steps, None)  # warm-up: traces the train function
    ratios, cpu_ratios, plain_rates, profiled_rates, recorded = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            logdir = os.path.join(tmp, f"round{round_}")
            if round_ % 2:
                profiled, profiled_cpu, window = run(model, data, steps, logdir)
                plain, plain_cpu, _ = run(model, data, steps, None)
            else:
                plain, plain_cpu, _ = run(model, data, steps, None)
                profiled, profiled_cpu, window = run(model, data, steps, logdir)
            plain_rates.append(plain)
            profiled_rates.append(profiled)
            recorded.append(window)
            ratios.append(profiled / plain)
            cpu_ratios.append(plain_cpu / profiled_cpu)
            print(f"round {round_ + 1:2d}: without {plain:7.1f} steps/s   with capture {profiled:7.1f} steps/s   "
                  f"ratio {profiled / plain:.3f}   CPU ms/step {plain_cpu * 1e3:.3f} vs {profiled_cpu * 1e3:.3f}")
    print(f"median steps/s: without {statistics.median(plain_rates):.1f}, with capture outside the recorded steps "
          f"{statistics.median(profiled_rates):.1f}")
    print(f"median of per-round ratios, steps/s with / without: {statistics.median(ratios):.3f} (target >= 0.98)")
    print(f"median of per-round ratios, CPU time per step without / with: {statistics.median(cpu_ratios):.3f}")
    # The fastest round of each is the one least disturbed by the rest of the machine (timeit's rule).
    print(f"best steps/s: without {max(plain_rates):.1f}, with capture {max(profiled_rates):.1f}, ratio "
          f"{max(profiled_rates) / max(plain_rates):.3f}")
    print(f"steps 5-9, the recorded ones, took {statistics.median(recorded) * 1000:.1f} ms (median; the profiler's "
          "start included, its stop falls in step 10)")


def mlp(hidden: int):
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.Input((256,)), tf.keras.layers.Dense(hidden, activation="relu"),
                                tf.keras.layers.Dense(hidden, activation="relu"), tf.keras.layers.Dense(10)])


def comm_worker(logdir: str) -> None:
    """One worker of the --comm job: every size of HIDDEN, each recorded into logdir/h<size>/<task>."""
    import numpy as np
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.profiling.callback import ProfileCallback

    strategy = tfl.strategies.build("multi_worker_mirrored", implementation="ring", timeout_seconds=300)
    rng = np.random.default_rng(0)
    x, y = rng.random((2048, 256), dtype=np.float32), rng.integers(0, 10, 2048)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat().prefetch(2).with_options(options)
    for hidden in HIDDEN:
        with strategy.scope():
            model = mlp(hidden)
            model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(data, steps_per_epoch=14, epochs=1, verbose=0,
                  callbacks=[ProfileCallback(os.path.join(logdir, f"h{hidden}"), steps="4-11")])


def comm_table(latency: str, bandwidth: str) -> None:
    from tensorfleet.planner.cost_model import Link
    from tensorfleet.profiling.breakdown import analyze
    from tensorfleet.profiling.planned import compare
    from tensorfleet.strategies.tf_config import ClusterSpec

    link = Link.from_strings(latency=latency, bandwidth=bandwidth)
    spec = ClusterSpec.local(workers=2)
    with tempfile.TemporaryDirectory() as logdir:
        procs = [subprocess.Popen([sys.executable, __file__, "--comm-worker", logdir],
                                  env={**os.environ, "TF_CONFIG": spec.tf_config_json("worker", i)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
        try:
            logs = [p.communicate(timeout=600)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs):
            raise SystemExit("a worker failed:\n" + "\n".join(log[-2000:] for log in logs))
        print(f"\n2 workers, MultiWorkerMirrored RING over 127.0.0.1; planner link: latency {latency}, "
              f"bandwidth {bandwidth}")
        print("| parameters | gradient MB | step ms | measured comm ms | share of step | planner ring ms | error |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        rows = []
        for hidden in HIDDEN:
            parameters = mlp(hidden).count_params()
            check = compare(analyze(os.path.join(logdir, f"h{hidden}")), gradient_bytes=4.0 * parameters,
                            workers=2, link=link)
            rows.append(check)
            print(f"| {parameters:,} | {check.gradient_bytes / 1e6:.2f} | {check.step_ms:.1f} | {check.measured_ms:.1f} | "
                  f"{check.measured_share:.0%} | {check.predicted_ms:.1f} | {check.error:+.0%} |")
        grows = all(a.measured_ms < b.measured_ms for a, b in zip(rows, rows[1:]))
        print(f"measured communication grows with model size as the planner predicts: {'yes' if grows else 'no'}")
        print(json.dumps([{"gradient_bytes": c.gradient_bytes, "measured_ms": round(c.measured_ms, 3),
                           "predicted_ms": round(c.predicted_ms, 3), "step_ms": round(c.step_ms, 3)} for c in rows]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--comm", action="store_true", help="Also measure communication against the planner.")
    parser.add_argument("--comm-only", action="store_true", help="Only the communication table.")
    parser.add_argument("--latency", default="1290us", help="Planner link latency (bench/collectives.py's fit).")
    parser.add_argument("--bandwidth", default="0.33GB/s", help="Planner link bandwidth (bench/collectives.py's fit).")
    parser.add_argument("--comm-worker", metavar="LOGDIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.comm_worker:
        comm_worker(args.comm_worker)
        return
    if not args.comm_only:
        overhead(args.rounds, args.steps)
    if args.comm or args.comm_only:
        comm_table(args.latency, args.bandwidth)


if __name__ == "__main__":
    main()
