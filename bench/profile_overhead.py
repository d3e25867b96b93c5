"""What recording a profile costs a job outside the recorded steps.

The same Keras fit (an MLP on synthetic data, batch 64, STEPS steps) runs with and without
tensorfleet's ProfileCallback recording steps 5-9; a timer reads the clock at the end of every
step and steps/s is taken over the steps after the recording (from step 30 on), so it measures
what the job pays once the profiler is off again, plus the callback's per-step hooks. The two
contenders alternate ROUNDS times in one process on one model (in A-B, B-A order, so a drift in
the machine's load favours neither); the median of the per-round ratios is printed (target
>= 0.98). Wall time swings with whatever else the machine runs, so the process's CPU time per
step over the same steps is compared too: it counts the work the capture adds, not the waiting.

Run: .venv/bin/python bench/profile_overhead.py [--rounds 12] [--steps 400]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FROM_STEP = 30


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x, y = rng.random((4096, 64), dtype=np.float32), rng.integers(0, 10, 4096)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).repeat().prefetch(tf.data.AUTOTUNE)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(256, activation="relu"),
                                 tf.keras.layers.Dense(256, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    run(model, data, args.steps, None)  # warm-up: traces the train function
    ratios, cpu_ratios, plain_rates, profiled_rates, recorded = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            logdir = os.path.join(tmp, f"round{round_}")
            if round_ % 2:
                profiled, profiled_cpu, window = run(model, data, args.steps, logdir)
                plain, plain_cpu, _ = run(model, data, args.steps, None)
            else:
                plain, plain_cpu, _ = run(model, data, args.steps, None)
                profiled, profiled_cpu, window = run(model, data, args.steps, logdir)
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
    print(f"steps 5-9, the recorded ones, took {statistics.median(recorded) * 1000:.1f} ms (median; the profiler's "
          "start included, its stop falls in step 10)")


if __name__ == "__main__":
    main()
