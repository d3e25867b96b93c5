"""Memory savers measured: peak memory of one training step, plain vs accumulation vs recomputation.

A 4 x 2048 ReLU MLP on 1024 inputs, SGD, batch 4096. Each contender runs in a fresh process
(TensorFlow on CPU reports no allocator statistics, so the measure is the growth of the
process's peak resident set from just before the first step to after three steps):

* ``plain``: ``fit`` on batches of 4096;
* ``accumulate8``: :func:`tensorfleet.strategies.memory_savers.accumulate_gradients` with 8
  micro-batches of 512 (one update per batch);
* ``recompute``: the hidden layers wrapped in :func:`tensorfleet.strategies.memory_savers.recompute`.

Beside each, the estimator's figures (``memory.estimate``) for the same model. Contenders are
alternated over the repeats; medians are reported.

Run: ``.venv/bin/python bench/memory_savers.py [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONTENDERS = ["plain", "accumulate8", "recompute"]

_CHILD = r"""
import os, resource, sys, json
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf
from tensorfleet.planner import memory
from tensorfleet.strategies import memory_savers
kind = sys.argv[1]
batch, width, depth = 4096, 2048, 4
rng = np.random.default_rng(0)
x = rng.random((batch, 1024), dtype=np.float32)
y = rng.integers(0, 10, batch).astype(np.int32)
inputs = tf.keras.Input(shape=(1024,))
hidden = [tf.keras.layers.Dense(width, activation="relu") for _ in range(depth)]
h = inputs
if kind == "recompute":
    h = memory_savers.recompute(hidden)(h)
else:
    for layer in hidden:
        h = layer(h)
model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(h))
estimate = memory.estimate(model, batch_size=batch, optimizer="sgd")
if kind == "accumulate8":
    model = memory_savers.accumulate_gradients(model, 8)
model.compile(optimizer=tf.keras.optimizers.SGD(0.01),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
def rss_kb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))
before = rss_kb()
model.fit(x, y, batch_size=batch, epochs=3, verbose=0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("RESULT" + json.dumps({"growth_mb": (peak - before) / 1024, "estimate": estimate.as_dict()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from tqdm import tqdm

    samples: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    estimates: dict[str, dict] = {}
    with tqdm(total=args.repeats * len(CONTENDERS), desc="memory savers") as bar:
        for _ in range(args.repeats):
            for kind in CONTENDERS:  # alternate the contenders
                proc = subprocess.run([sys.executable, "-c", _CHILD, kind], capture_output=True, text=True,
                                      timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
                if proc.returncode != 0:
                    raise RuntimeError(f"{kind} failed: {proc.stderr[-2000:]}")
                out = json.loads(next(text for text in proc.stdout.splitlines() if text.startswith("RESULT"))[6:])
                samples[kind].append(out["growth_mb"])
                estimates[kind] = out["estimate"]
                bar.update(1)
    print(f"# memory savers, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"{args.repeats} repeats alternated\n")
    print("| contender | peak RSS growth, MB (median) | runs | estimated activations, MB (full batch) |")
    print("|---|---|---|---|")
    for kind in CONTENDERS:
        print(f"| {kind} | {statistics.median(samples[kind]):.0f} | "
              f"{', '.join(f'{v:.0f}' for v in samples[kind])} | {estimates[kind]['activations'] / 1e6:.0f} |")
    plain = statistics.median(samples["plain"])
    print("\nratio to plain: " + ", ".join(f"{k} {statistics.median(samples[k]) / plain:.2f}x" for k in CONTENDERS))
    est = estimates["plain"]
    print(f"estimated model states (SGD, float32): {est['model_states'] / 1e6:.0f} MB; "
          f"activations at batch 4096: {est['activations'] / 1e6:.0f} MB, at micro-batch 512: "
          f"{est['activations'] / 8e6:.0f} MB")


if __name__ == "__main__":
    main()
