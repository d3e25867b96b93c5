"""Collectives: exact traffic counts, and the alpha-beta model against TensorFlow's own all-reduces.

1. Counts table: every all-reduce algorithm of ``tensorfleet.strategies.collectives`` executed
   with real tensors over N = 2, 4, 8 logical CPU devices; values sent and steps, against the
   classic formulas.
2. Validation: TensorFlow's ``ReductionToOneDevice`` and ``HierarchicalCopyAllReduce`` over 4
   logical CPU devices (MirroredStrategy), and a 2-process ``MultiWorkerMirroredStrategy``
   with the RING implementation over 127.0.0.1, for tensors of 1 KB to 64 MB. Contenders are
   alternated within each repetition and the median is kept. Alpha and beta are fitted per
   implementation on every other size and the prediction error is reported on all sizes
   (held-out ones marked). A PNG plots time against size.

Run: ``.venv/bin/python bench/collectives.py [--quick] [--out out/bench]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SIZES = [2**10 * 4**k for k in range(9)]  # 1 KB .. 64 MB
LOCAL_DEVICES = 8


def counts_table() -> list[str]:
    import numpy as np

    from tensorfleet.strategies import collectives as C

    lines = ["| algorithm | N | total sent (executed) | exact formula | classic formula | steps |",
             "|---|---|---|---|---|---|"]
    m = 48
    for n in (2, 4, 8):
        values = [np.full(m, i, np.float32) for i in range(n)]
        for name in C.COLLECTIVES.names():
            result = C.all_reduce(values, algorithm=name)
            assert all(np.array_equal(o.numpy(), np.full(m, n * (n - 1) / 2)) for o in result.outputs)
            lines.append(f"| {name} | {n} | {result.trace.total_sent} | {C.exact_traffic(name, n, m)} | "
                         f"{C.classic_traffic(name, n, m)} | {result.trace.num_steps} |")
    return lines


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def measure_local(sizes: list[int], repeats: int) -> dict[str, dict[int, float]]:
    """Median seconds of one all-reduce over 4 logical CPUs, per implementation and size."""
    import tensorflow as tf
    from tqdm import tqdm

    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:4]
    contenders = {
        "ReductionToOneDevice": tf.distribute.ReductionToOneDevice(),
        "HierarchicalCopyAllReduce": tf.distribute.HierarchicalCopyAllReduce(num_packs=1),
    }
    strategies = {k: tf.distribute.MirroredStrategy(devices, cross_device_ops=v) for k, v in contenders.items()}
    out: dict[str, dict[int, float]] = {k: {} for k in contenders}
    for size in tqdm(sizes, desc="local all-reduce sizes"):
        n = size // 4
        samples: dict[str, list[float]] = {k: [] for k in contenders}
        values = {}
        for name, strategy in strategies.items():
            values[name] = strategy.experimental_distribute_values_from_function(
                lambda ctx: tf.fill([n], tf.cast(ctx.replica_id_in_sync_group, tf.float32)))
            strategy.extended.reduce_to(tf.distribute.ReduceOp.SUM, values[name], destinations=values[name])  # warm-up
        for _ in range(repeats):
            for name, strategy in strategies.items():  # alternate the contenders
                start = time.perf_counter()
                result = strategy.extended.reduce_to(tf.distribute.ReduceOp.SUM, values[name], destinations=values[name])
                for t in strategy.experimental_local_results(result):
                    t.numpy()[:1]  # wait for every device's copy
                samples[name].append(time.perf_counter() - start)
        for name in contenders:
            out[name][size] = _median(samples[name])
    return out


_WORKER = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
sizes, repeats = json.loads(sys.argv[1]), int(sys.argv[2])
options = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
out = {}
for size in sizes:
    n = size // 4
    def replica_fn(v):
        # Inside tf.function a plain tensor has no device, and the all-reduce needs one.
        with tf.device(strategy.extended.worker_devices[0]):
            v = tf.identity(v)
        return tf.distribute.get_replica_context().all_reduce("sum", v)
    @tf.function
    def step(x):
        return strategy.run(replica_fn, args=(x,))
    x = tf.fill([n], 1.0)
    step(x).numpy()
    times = []
    for _ in range(repeats):
        t = time.perf_counter(); step(x).numpy(); times.append(time.perf_counter() - t)
    times.sort()
    out[size] = times[len(times) // 2]
if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
    print("RESULT" + json.dumps(out))
"""


def measure_ring(sizes: list[int], repeats: int, timeout: float = 600.0) -> dict[int, float]:
    """Median seconds of a 2-worker RING all-reduce over 127.0.0.1 (two processes)."""
    import portpicker

    ports = [portpicker.pick_unused_port() for _ in range(2)]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    try:
        for i in range(2):
            env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
            procs.append(subprocess.Popen([sys.executable, "-c", _WORKER, json.dumps(sizes), str(repeats)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs):
        if p.returncode != 0:
            raise RuntimeError(f"ring worker failed ({p.returncode}): {err[-2000:]}")
    line = next(l for l in outputs[0][0].splitlines() if l.startswith("RESULT"))
    return {int(k): v for k, v in json.loads(line[6:]).items()}


# Each TensorFlow implementation as the algorithm of the step model it follows:
# ReductionToOneDevice gathers to one device and broadcasts back (the parameter-server
# pattern); HierarchicalCopyAllReduce with one pack is, on one group of 4 devices, a
# reduce-to-one then broadcast too; RING over 2 workers is the ring.
MODEL = {"ReductionToOneDevice": ("ps", 4), "HierarchicalCopyAllReduce": ("ps", 4), "MultiWorker RING": ("ring", 2)}


def validate(measured: dict[str, dict[int, float]]) -> tuple[list[str], dict[str, object]]:
    from tensorfleet.strategies import cost_model

    lines = ["| implementation | size | measured ms | predicted ms | error | fit/held-out |", "|---|---|---|---|---|---|"]
    fits: dict[str, object] = {}
    for name, by_size in measured.items():
        algorithm, n = MODEL[name]
        sizes = sorted(by_size)
        train = sizes[::2]
        profile = {s: cost_model.step_bytes(algorithm, n, float(s)) for s in sizes}
        link = cost_model.fit_alpha_beta([sum(profile[s]) for s in train], [by_size[s] for s in train],
                                         steps=[len(profile[s]) for s in train])
        errors = {}
        for s in sizes:
            predicted = cost_model.predict(algorithm, n, float(s), link)
            errors[s] = (predicted - by_size[s]) / by_size[s]
            lines.append(f"| {name} | {_human(s)} | {by_size[s] * 1e3:.3f} | {predicted * 1e3:.3f} | "
                         f"{errors[s]:+.0%} | {'fit' if s in train else 'held-out'} |")
        within = sum(abs(e) <= 0.25 for e in errors.values())
        fits[name] = {"alpha_s": link.alpha, "bandwidth_GBps": link.bandwidth / 1e9, "within_25pct": within,
                      "sizes": len(sizes), "median_abs_error": sorted(abs(e) for e in errors.values())[len(sizes) // 2]}
    return lines, fits


def _human(size: int) -> str:
    return f"{size // 2**20} MB" if size >= 2**20 else f"{size // 2**10} KB"


def plot(measured: dict[str, dict[int, float]], fits: dict[str, object], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tensorfleet.io import save_figure
    from tensorfleet.strategies import cost_model

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, by_size in measured.items():
        algorithm, n = MODEL[name]
        sizes = sorted(by_size)
        fit = fits[name]
        link = cost_model.Link(alpha=fit["alpha_s"], beta=1 / (fit["bandwidth_GBps"] * 1e9))  # type: ignore[index]
        line, = ax.plot(sizes, [by_size[s] for s in sizes], "o", label=f"{name} measured")
        ax.plot(sizes, [cost_model.predict(algorithm, n, float(s), link) for s in sizes], "-", color=line.get_color(),
                label=f"{name} alpha-beta ({algorithm}, N={n})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tensor size per device (bytes)")
    ax.set_ylabel("seconds per all-reduce")
    ax.set_title("All-reduce time vs size: measured and alpha-beta prediction")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 1 MB, 3 repeats")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="out/bench")
    args = parser.parse_args()
    sizes = SIZES[:6] if args.quick else SIZES
    repeats = 3 if args.quick else args.repeats

    from tensorfleet.strategies.devices import simulate_devices

    simulate_devices(LOCAL_DEVICES)
    print(f"# collectives validation, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, {LOCAL_DEVICES} logical CPU devices\n")
    print("## Traffic counts (values sent, M = 48 values per node)\n")
    print("\n".join(counts_table()))
    measured = measure_local(sizes, repeats)
    measured["MultiWorker RING"] = measure_ring(sizes, repeats)
    lines, fits = validate(measured)
    print("\n## Predicted vs measured (alpha, beta fitted on every other size)\n")
    print("\n".join(lines))
    print("\n## Fitted links\n")
    for name, fit in fits.items():
        print(f"- {name}: alpha = {fit['alpha_s'] * 1e6:.1f} us, bandwidth = {fit['bandwidth_GBps']:.2f} GB/s, "
              f"{fit['within_25pct']}/{fit['sizes']} sizes within 25%, median |error| {fit['median_abs_error']:.0%}")
    os.makedirs(args.out, exist_ok=True)
    png = os.path.join(args.out, "collectives_time_vs_size.png")
    plot(measured, fits, png)
    from tensorfleet.io import write_json

    write_json(os.path.join(args.out, "collectives.json"),
               {"measured": {k: {str(s): t for s, t in v.items()} for k, v in measured.items()}, "fits": fits})
    print(f"\nplot: {png}")


if __name__ == "__main__":
    main()
