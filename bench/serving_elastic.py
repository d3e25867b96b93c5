"""`tensorfleet serve` under a bursty trace: a fixed pool at the maximum vs elastic vs scaling to zero.

A 2.5M-parameter MLP on 8x8 digits (9.9 MB of float32 weights: the issue's "model of up to 10 MB")
is exported once, with warm-up records. The same bursty trace (BURSTS bursts of CONCURRENCY
closed-loop REST callers for BURST_SECONDS each, separated by gaps, the long ones longer than the
idle timeout) is replayed against three `tensorfleet serve` processes, one after another in one
run, each on 127.0.0.1:

* fixed:   --replicas MAX (the pool always at the maximum);
* elastic: --min-replicas 1 --max-replicas MAX;
* zero:    --min-replicas 0 --max-replicas MAX --idle-timeout IDLE (a standby process with
  TensorFlow imported; the first request of a burst after the window starts a replica).

Reported per server: requests, errors (any non-200 or failed connection), request p50/p99
outside cold starts, the cold-start requests' request-to-answer p50/p99 (a request is a cold-start
one when it waited for a replica that a cold start brought up: sent while the server had no
replica, answered after the cold start), the server's own cold-start durations with where the time
went (SavedModel load, warm-up replay), and replica-seconds from the server's Prometheus metrics.
Targets: cold-start p99 <= 2 s, p99 outside cold starts <= 2x the fixed pool's, replica-seconds
>= 50% fewer than the fixed pool's, zero errors. The zero server's replicas-over-time plot (with
its cold starts) is written to --plot.

Run: .venv/bin/python bench/serving_elastic.py [--plot docs/serving_scale_to_zero.png]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MAX, IDLE, CONCURRENCY, BURST_SECONDS = 2, 8.0, 6, 3.0
GAPS = (2.0, 14.0, 3.0, 14.0)  # after each burst but the last: short ones keep replicas, long ones pass IDLE
BURSTS = len(GAPS) + 1


def export_model(root: Path) -> tuple[Path, list[list[float]]]:
    import numpy as np
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.serving.saved_model import export

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((8, 8, 1), name="image"), tf.keras.layers.Flatten(),
                                 tf.keras.layers.Dense(1536, activation="relu"),
                                 tf.keras.layers.Dense(1536, activation="relu"),
                                 tf.keras.layers.Dense(10, name="logits")])
    images = tfl.models.datasets.load_digits().x_test[:8].astype(np.float32)
    base = root / "mlp"
    export(model, base, version=1, warmup=images[:4])
    size = sum(int(np.prod(v.shape)) * 4 for v in model.weights)
    print(f"model: {model.count_params():,} parameters, {size / 1e6:.1f} MB of float32 weights")
    return base, images[:1].tolist()


def start(base: Path, flags: list[str], plot: str | None) -> tuple[subprocess.Popen, int, list[str]]:
    import portpicker

    grpc_port, rest_port = portpicker.pick_unused_port(), portpicker.pick_unused_port()
    command = [sys.executable, "-m", "tensorfleet.cli.main", "serve", str(base), "--model-name", "mlp",
               "--port", str(grpc_port), "--rest-api-port", str(rest_port), "--file-system-poll-wait-seconds", "0",
               *flags, *(["--scale-plot", plot] if plot else [])]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if line.startswith("[serve] batching:"):
            threading.Thread(target=lambda: lines.extend(x.rstrip() for x in process.stdout), daemon=True).start()
            return process, rest_port, lines
    process.kill()
    raise RuntimeError(f"the server with flags {flags} did not start: {lines[-5:]}")


def burst(port: int, body: bytes, seconds: float, records: list[tuple[float, float, bool]]) -> None:
    """CONCURRENCY closed-loop keep-alive callers for ``seconds``; (sent, answered, ok) per request."""
    stop_at = time.monotonic() + seconds

    def caller() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < stop_at:
            sent = time.monotonic()
            try:
                connection.request("POST", "/v1/models/mlp:predict", body, {"Content-Type": "application/json"})
                reply = connection.getresponse()
                reply.read()
                ok = reply.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            records.append((sent, time.monotonic(), ok))
        connection.close()

    threads = [threading.Thread(target=caller) for _ in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 120)


def scrape(port: int, metric: str) -> float:
    """The sum of a metric's samples in the server's Prometheus text."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/monitoring/prometheus/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    return sum(float(m) for m in re.findall(rf"^:tensorflow:serving:{metric}\{{[^}}]*\}} (\S+)$", text, re.M))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(name: str, base: Path, flags: list[str], body: bytes, plot: str | None) -> dict:
    process, port, lines = start(base, flags, plot)
    began = time.monotonic()
    bursts: list[list[tuple[float, float, bool]]] = []
    at_zero: list[bool] = []  # whether each burst began with no replica
    try:
        for i in range(BURSTS):
            at_zero.append(scrape(port, "replicas") == 0)
            records: list[tuple[float, float, bool]] = []
            burst(port, body, BURST_SECONDS, records)
            bursts.append(records)
            if i < len(GAPS):
                time.sleep(GAPS[i])
        seconds = scrape(port, "replica_seconds_total")
        wall = time.monotonic() - began
    finally:
        process.terminate()
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
    colds = [(float(m[1]), float(m[2]), int(m[3]), float(m[4])) for m in
             (re.search(r"ready in ([\d.]+)s \(SavedModel load ([\d.]+)s, (\d+) warm-up records ([\d.]+)s\)", line)
              for line in lines) if m]
    cold, warm = [], []
    for zero, records in zip(at_zero, bursts):  # from zero, the requests sent before the first answer waited
        first_answer = min(answered for _, answered, _ in records)
        for sent, answered, _ in records:
            (cold if zero and sent <= first_answer else warm).append(answered - sent)
    return {"name": name, "requests": sum(len(r) for r in bursts),
            "errors": sum(not ok for r in bursts for _, _, ok in r), "warm": warm, "cold": cold, "colds": colds,
            "replica_seconds": seconds, "wall": wall, "bursts_from_zero": sum(at_zero)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plot", default=None, help="PNG of the zero server's replicas over time")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-elastic-"))
    base, image = export_model(root)
    body = json.dumps({"instances": image}).encode()
    configs = {
        "fixed": ["--replicas", str(MAX)],
        "elastic": ["--min-replicas", "1", "--max-replicas", str(MAX), "--scale-target-ms", "10"],
        "zero": ["--min-replicas", "0", "--max-replicas", str(MAX), "--idle-timeout", f"{IDLE:g}",
                 "--scale-target-ms", "10"],
    }
    load = os.getloadavg()
    results = [run(name, base, flags, body, args.plot if name == "zero" else None) for name, flags in configs.items()]
    report(results, load)


def report(results: list[dict], load: tuple[float, float, float]) -> None:
    print(f"bursty trace: {BURSTS} bursts of {CONCURRENCY} closed-loop REST callers for {BURST_SECONDS:g} s, gaps "
          f"{list(GAPS)} s; idle timeout {IDLE:g} s; max {MAX} replicas; {os.cpu_count()} cores; load average "
          f"{load[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"{'server':<9}{'requests':>9}{'errors':>7}{'p50 ms':>9}{'p99 ms':>9}{'cold reqs':>10}{'cold p50 s':>11}"
          f"{'cold p99 s':>11}{'replica-s':>10}{'wall s':>8}")
    for r in results:
        print(f"{r['name']:<9}{r['requests']:>9}{r['errors']:>7}{percentile(r['warm'], .5) * 1e3:>9.1f}"
              f"{percentile(r['warm'], .99) * 1e3:>9.1f}{len(r['cold']):>10}{percentile(r['cold'], .5):>11.2f}"
              f"{percentile(r['cold'], .99):>11.2f}{r['replica_seconds']:>10.1f}{r['wall']:>8.1f}")
    fixed, zero = results[0], results[-1]
    for r in results:
        if r["colds"]:
            loads = [c[1] for c in r["colds"]]
            print(f"{r['name']}: {len(r['colds'])} cold starts in the server, replica ready in "
                  f"{', '.join(f'{c[0]:.2f}' for c in r['colds'])} s (SavedModel load median "
                  f"{statistics.median(loads):.2f} s, {r['colds'][0][2]} warm-up records median "
                  f"{statistics.median(c[3] for c in r['colds']):.2f} s)")
    cold_p99 = percentile(zero["cold"], .99)
    ratio = percentile(zero["warm"], .99) / percentile(fixed["warm"], .99)
    saved = 1 - zero["replica_seconds"] / fixed["replica_seconds"]
    errors = sum(r["errors"] for r in results)
    print(f"targets: cold-start p99 {cold_p99:.2f} s <= 2 s: {'met' if cold_p99 <= 2 else 'not met'}; "
          f"p99 outside cold starts {ratio:.2f}x the fixed pool's <= 2x: {'met' if ratio <= 2 else 'not met'}; "
          f"replica-seconds {saved:.0%} fewer than the fixed pool's >= 50%: {'met' if saved >= 0.5 else 'not met'}; "
          f"errors {errors}: {'met' if errors == 0 else 'not met'}")


if __name__ == "__main__":
    main()
