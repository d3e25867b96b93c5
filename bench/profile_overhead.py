"""What recording a profile costs a job outside the recorded steps.

The same Keras fit (an MLP on synthetic data, batch 64, STEPS steps in epochs of EPOCH steps) runs
with and without tensorfleet's ProfileCallback recording steps 5-9. The clock is an epoch-level
callback, so the fit without capture calls no batch hook at all, as a user's ``fit(verbose=0)``;
whatever the callback makes Keras do per step is therefore counted. Only the epochs after the first
are timed: the recording, the profiler's start and stop and the trace's writing fall in the first,
so what is measured is what the job pays once the profiler is off again. A run's time per step is
the median over its epochs (a stall of the machine in one epoch does not move it); its CPU time per
step is the process's over the same epochs.

The two contenders alternate ROUNDS times in one process on one model, in A-B, B-A order (a drift
in the machine's load favours neither), each after a garbage collection. Printed: the median of the
per-round speed ratios (with / without; target >= 0.98) with their quartiles, the same for CPU time,
and the ratio of the medians over all rounds. Only ratios within one run mean anything: the machine
is shared. Last, a count that load does not move: the Python calls per step after the first epoch,
without and with capture.

Then (``--comm``) measured communication against the planner: a 2-process MultiWorkerMirrored job
(RING over gRPC on 127.0.0.1) trains an MLP of 3 sizes, each recorded with ProfileCallback
(steps 4-11) into its own directory; the communication per step measured in the trace (the least
among the workers, median over steps) is set beside the planner's ring all-reduce of the model's
gradient bytes over the link ``--latency``/``--bandwidth`` (defaults: the alpha-beta fit of
bench/collectives.py's 2-process RING on this machine, bench/RESULTS.md).

Run: .venv/bin/python bench/profile_overhead.py [--rounds 16] [--steps 800] [--comm] [--comm-only]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorfleet  # noqa: E402,F401  (before TensorFlow: it selects tf_keras, the Keras the profiler's callback takes)

EPOCH = 50  # steps per epoch: a run's time per step is the median over its epochs after the first
HIDDEN = (128, 512, 2048)  # MLP 256 -> h -> h -> 10: about 50K, 400K and 4.7M parameters


def run(model, data, steps: int, logdir: str | None) -> tuple[float, float]:
    """(median ms per step over the epochs after the first, CPU ms per step over the same epochs)."""
    import tensorflow as tf

    from tensorfleet.profiling.callback import ProfileCallback

    ends: list[float] = []
    cpu: list[float] = []

    class EpochClock(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            ends.append(time.perf_counter())
            cpu.append(time.process_time())

    callbacks = [EpochClock()] + ([ProfileCallback(logdir, steps="5-9")] if logdir else [])
    gc.collect()
    model.fit(data, steps_per_epoch=EPOCH, epochs=max(2, steps // EPOCH), verbose=0, callbacks=callbacks)
    per_step = [(b - a) / EPOCH * 1e3 for a, b in zip(ends, ends[1:])]
    return statistics.median(per_step), (cpu[-1] - cpu[0]) / (EPOCH * (len(ends) - 1)) * 1e3


def python_calls_per_step(model, data, logdir: str | None) -> float:
    """Python function calls (and calls into C from Python) per step after the first epoch: a count,
    so unlike a time it does not move with the machine's load."""
    import tensorflow as tf

    from tensorfleet.profiling.callback import ProfileCallback

    calls = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1

    class Counter(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            sys.setprofile(count if epoch == 0 else None)

    callbacks = [Counter()] + ([ProfileCallback(logdir, steps="5-9")] if logdir else [])
    model.fit(data, steps_per_epoch=EPOCH, epochs=2, verbose=0, callbacks=callbacks)
    sys.setprofile(None)
    return calls[0] / EPOCH


def _quartiles(values: list[float]) -> str:
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return f"{statistics.median(values):.3f} (quartiles {q1:.3f}-{q3:.3f}, range {min(values):.3f}-{max(values):.3f})"


def overhead(rounds: int, steps: int) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x, y = rng.random((4096, 64), dtype=np.float32), rng.integers(0, 10, 4096)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).repeat().prefetch(tf.data.AUTOTUNE)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(256, activation="relu"),
                                 tf.keras.layers.Dense(256, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    run(model, data, 2 * EPOCH, None)  # warm-up: traces the train function
    plain_ms, profiled_ms, plain_cpu, profiled_cpu = [], [], [], []
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            logdir = os.path.join(tmp, f"round{round_}")
            order = (logdir, None) if round_ % 2 else (None, logdir)
            results = {which: run(model, data, steps, which) for which in order}
            (plain, p_cpu), (profiled, c_cpu) = results[None], results[logdir]
            plain_ms.append(plain)
            profiled_ms.append(profiled)
            plain_cpu.append(p_cpu)
            profiled_cpu.append(c_cpu)
            print(f"round {round_ + 1:2d}: ms/step without {plain:.4f}, with capture {profiled:.4f}, speed ratio "
                  f"{plain / profiled:.3f}; CPU ms/step {p_cpu:.4f} vs {c_cpu:.4f}", flush=True)
    print(f"{rounds} rounds of {max(2, steps // EPOCH)} epochs of {EPOCH} steps in {time.time() - start:.0f} s")
    print(f"median ms/step: without {statistics.median(plain_ms):.4f}, with capture outside the recorded steps "
          f"{statistics.median(profiled_ms):.4f}")
    print("speed with / without capture, per round: "
          f"{_quartiles([p / c for p, c in zip(plain_ms, profiled_ms)])} (target >= 0.98)")
    print("CPU time per step without / with, per round: "
          f"{_quartiles([p / c for p, c in zip(plain_cpu, profiled_cpu)])}")
    with tempfile.TemporaryDirectory() as tmp:
        counted = [python_calls_per_step(model, data, which) for which in (None, tmp)]
    print(f"Python calls per step after the first epoch: without {counted[0]:.1f}, with capture {counted[1]:.1f}")
    print("ratio of the medians over all rounds: speed "
          f"{statistics.median(plain_ms) / statistics.median(profiled_ms):.3f}, CPU "
          f"{statistics.median(plain_cpu) / statistics.median(profiled_cpu):.3f}")


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
            print(f"| {parameters:,} | {check.gradient_bytes / 1e6:.2f} | {check.step_ms:.1f} | "
                  f"{check.measured_ms:.1f} | {check.measured_share:.0%} | {check.predicted_ms:.1f} | "
                  f"{check.error:+.0%} |")
        grows = all(a.measured_ms < b.measured_ms for a, b in zip(rows, rows[1:]))
        print(f"measured communication grows with model size as the planner predicts: {'yes' if grows else 'no'}")
        print(json.dumps([{"gradient_bytes": c.gradient_bytes, "measured_ms": round(c.measured_ms, 3),
                           "predicted_ms": round(c.predicted_ms, 3), "step_ms": round(c.step_ms, 3)} for c in rows]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=800, help=f"Steps per run, in epochs of {EPOCH}.")
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
