"""`tensorfleet serve`: one signature call per request vs dynamic batching vs 2 replicas, side by side.

The digits CNN (digits_cnn, seed 0) is exported once and served by three `tensorfleet serve`
processes on 127.0.0.1 at the same time: one without batching, one with --enable-batching, one
with --enable-batching and --replicas 2 (the model in two worker processes). A
closed-loop load generator (aiohttp, one event loop, CONCURRENCY callers each sending its next
one-image REST :predict as soon as the last is answered) drives each server for SECONDS at every
concurrency; the servers alternate ROUNDS times at each level and the medians are reported.
Every request is bounded (timeout) and every run stops by itself (duration and request cap).
Prints requests/s, p50/p99 latency and the server's CPU time per request for each server and
concurrency, and the ratios to per-request (target at concurrency 32: >= 3x the requests/s with
p99 no worse).

Run: .venv/bin/python bench/serving.py [--concurrency 1,4,16,32,64] [--seconds 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BATCHING = ["--enable-batching", "--max-batch-size", "32", "--batch-timeout-micros", "2000"]
SERVERS = {
    "per-request": [],
    "dynamic batching": [*BATCHING, "--num-batch-threads", "1"],
    "batching+2 replicas": [*BATCHING, "--num-batch-threads", "2", "--replicas", "2"],
}
MAX_REQUESTS = 50_000  # per run, whatever the duration


def start_server(base: Path, flags: list[str]) -> tuple[subprocess.Popen, int]:
    import portpicker

    grpc_port, rest_port = portpicker.pick_unused_port(), portpicker.pick_unused_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorfleet.cli.main", "serve", str(base), "--model-name", "digits",
         "--port", str(grpc_port), "--rest-api-port", str(rest_port), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if line.startswith("[serve] batching:"):
            return process, rest_port
    process.kill()
    raise RuntimeError(f"the server with flags {flags} did not start")


async def run_load(port: int, body: bytes, concurrency: int, seconds: float) -> tuple[float, list[float]]:
    """(requests/s, latencies in seconds) of ``concurrency`` closed-loop callers for ``seconds``."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/models/digits:predict"
    latencies: list[float] = []
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        stop_at = time.perf_counter() + seconds

        async def caller() -> None:
            while time.perf_counter() < stop_at and len(latencies) < MAX_REQUESTS:
                start = time.perf_counter()
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as reply:
                    await reply.read()
                    if reply.status != 200:
                        raise RuntimeError(f"HTTP {reply.status}")
                latencies.append(time.perf_counter() - start)

        began = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return len(latencies) / elapsed, latencies


def server_cpu_seconds(pid: int) -> float:
    """CPU time of the server and its replica processes so far."""
    import psutil

    process = psutil.Process(pid)
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="1,4,16,32,64")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    if not all(1 <= c <= 64 for c in levels) or not 0 < args.seconds <= 30 or not 1 <= args.rounds <= 5:
        raise SystemExit("concurrency must be 1..64, seconds 0..30, rounds 1..5")

    import numpy as np

    import tensorfleet as tfl
    from tensorfleet.serving.saved_model import export

    base = Path(tempfile.mkdtemp(prefix="bench-serving-")) / "digits"
    export(tfl.models.build("digits_cnn", seed=0), base, version=1)
    image = tfl.models.datasets.load_digits().x_test[:1].astype(np.float32)
    body = json.dumps({"instances": image.tolist()}).encode()
    servers = {name: start_server(base, flags) for name, flags in SERVERS.items()}
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    try:
        for name, (_, port) in servers.items():  # warm-up: first calls, connections, kernels
            asyncio.run(run_load(port, body, 8, 1.0))
        for concurrency in levels:
            for _ in range(args.rounds):
                for name, (process, port) in servers.items():
                    cpu = server_cpu_seconds(process.pid)
                    rate, latencies = asyncio.run(run_load(port, body, concurrency, args.seconds))
                    cpu_us = (server_cpu_seconds(process.pid) - cpu) / len(latencies) * 1e6
                    results.setdefault((name, concurrency), []).append(
                        (rate, percentile(latencies, 0.50) * 1e3, percentile(latencies, 0.99) * 1e3, cpu_us))
    finally:
        for process, _ in servers.values():
            process.terminate()
        for name, (process, _) in servers.items():
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                print(f"note: the {name} server had not exited 60 s after SIGTERM; killed")
                process.kill()
                process.wait(30)
    report(results, levels, args)


def report(results: dict, levels: list[int], args: argparse.Namespace) -> None:
    print(f"tensorfleet serve, digits_cnn, one image per REST :predict, closed loop on 127.0.0.1; "
          f"{args.seconds:g} s per run, medians of {args.rounds} alternating rounds; {os.cpu_count()} cores "
          f"shared by the servers and the load generator (load average {os.getloadavg()[0]:.1f} at the end). "
          "'server CPU/req' is the server's (and its replicas') CPU time per answered request, which other "
          "load on the machine disturbs less than requests/s")
    print(f"{'server':<21}{'concurrency':>12}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'server CPU/req us':>19}")
    medians = {}
    for concurrency in levels:
        for name in SERVERS:
            runs = results[(name, concurrency)]
            medians[(name, concurrency)] = tuple(statistics.median(r[i] for r in runs) for i in range(4))
            rate, p50, p99, cpu_us = medians[(name, concurrency)]
            print(f"{name:<21}{concurrency:>12}{rate:>10.0f}{p50:>9.2f}{p99:>9.2f}{cpu_us:>19.0f}")
    for name in list(SERVERS)[1:]:
        print(f"{name} / per-request:")
        for concurrency in levels:
            (r1, _, q1, c1), (r2, _, q2, c2) = medians[("per-request", concurrency)], medians[(name, concurrency)]
            print(f"  concurrency {concurrency:>2}: {r2 / r1:.2f}x requests/s, p99 {q2:.2f} ms vs {q1:.2f} ms, "
                  f"server CPU per request {c2 / c1:.2f}x")


if __name__ == "__main__":
    main()
