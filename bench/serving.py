"""`tensorfleet serve`: one signature call per request vs fixed-timeout vs adaptive batching, side by side.

The digits CNN (digits_cnn, seed 0) is exported once and served by three `tensorfleet serve`
processes on 127.0.0.1 at the same time: one without batching, one with --enable-batching
--batching-policy timeout (the first request of a batch waits --batch-timeout-micros for others,
as TF Serving's batcher does) and one with --batching-policy adaptive (a batch goes at once when
the server is idle and gathers only while more requests are on their way). A closed-loop load
generator (one event loop, uvloop when installed, CONCURRENCY keep-alive HTTP/1.1 connections,
each sending its next one-image REST :predict as soon as the last is answered, written as raw
bytes so that the generator costs little CPU per request) sends a fixed number of requests
(--requests, 5,000 by default, so that a p99 is the 50th-slowest of them) to each server at every
concurrency. The servers alternate ROUNDS times at each level, in a rotated order each round, so
that drifts of the machine's load hit them alike; the medians over rounds are reported, and each
ratio to per-request is computed within a round and printed as its median with the lowest and
highest round. Every run stops by itself (request count, and a 120 s cap; a stuck server fails
it 30 s later). Prints requests/s, p50/p99 latency, the CPU time per request of the server and
of the load generator, and the batches' mean size, for each server and concurrency (targets:
adaptive >= 0.95x per-request's requests/s with p99 no worse than 1/0.95 of it at concurrency 1
and 4, and >= 4x the requests/s at 32).

Run: .venv/bin/python bench/serving.py [--concurrency 1,4,16,32,64] [--requests 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
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
    "timeout batching": [*BATCHING, "--num-batch-threads", "1", "--batching-policy", "timeout"],
    "adaptive batching": [*BATCHING, "--num-batch-threads", "1", "--batching-policy", "adaptive"],
}
DEADLINE = 120.0  # seconds a run may take at most, whatever its request count


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


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line[15:])
    return None


class _Budget:
    """The requests a run may still send (shared by its connections) and when it must stop."""

    def __init__(self, requests: int) -> None:
        self.left, self.stop_at = requests, time.perf_counter() + DEADLINE

    def take(self) -> bool:
        if self.left <= 0 or time.perf_counter() > self.stop_at:
            return False
        self.left -= 1
        return True


class _Caller(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection of the closed loop: the next request goes out as soon as
    the last reply is whole. Raw bytes both ways (one request written once; a reply's end found from
    its Content-Length), so the generator spends as little CPU per request as it can."""

    def __init__(self, request: bytes, budget: _Budget, latencies: list[float], done: asyncio.Future) -> None:
        self.request, self.budget, self.latencies, self.done = request, budget, latencies, done
        self.buffer, self.need, self.start, self.transport = b"", 0, 0.0, None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._next()

    def _next(self) -> None:
        if self.budget.take():
            self.start = time.perf_counter()
            self.transport.write(self.request)
        else:
            self._finish(None)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.need:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = _content_length(head)
            if not head.startswith(b"http/1.1 200") or length is None:
                return self._finish(RuntimeError(f"reply {self.buffer[:end][:300]!r}"))
            self.need = end + 4 + length
        if len(self.buffer) < self.need:
            return
        self.latencies.append(time.perf_counter() - self.start)
        self.buffer, self.need = self.buffer[self.need:], 0
        self._next()

    def _finish(self, error: BaseException | None) -> None:
        if not self.done.done():
            self.done.set_exception(error) if error else self.done.set_result(None)
        self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"the server closed the connection: {exc!r}"))


async def _run_load(port: int, body: bytes, concurrency: int, requests: int) -> tuple[float, list[float]]:
    loop = asyncio.get_running_loop()
    request = (f"POST /v1/models/digits:predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    latencies: list[float] = []
    sockets = []
    for _ in range(concurrency):  # every connection open before the first request goes
        sockets.append(await loop.run_in_executor(None, socket.create_connection, ("127.0.0.1", port)))
    began = time.perf_counter()
    budget = _Budget(requests)
    dones = [loop.create_future() for _ in range(concurrency)]
    for sock, done in zip(sockets, dones):
        await loop.create_connection(lambda d=done: _Caller(request, budget, latencies, d), sock=sock)
    await asyncio.wait_for(asyncio.gather(*dones), DEADLINE + 30)  # a stuck server fails the run, bounded
    return len(latencies) / (time.perf_counter() - began), latencies


def run_load(port: int, body: bytes, concurrency: int, requests: int) -> tuple[float, list[float], float]:
    """(requests/s, latencies in seconds, the generator's CPU seconds) of ``concurrency`` closed-loop
    callers sending ``requests`` in all, on uvloop when it is installed."""
    from tensorfleet.serving.rest import new_event_loop  # the server's own choice of loop

    cpu = time.process_time()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        rate, latencies = runner.run(_run_load(port, body, concurrency, requests))
    return rate, latencies, time.process_time() - cpu


def batch_totals(port: int) -> tuple[float, float]:
    """(rows, batches) the server's signature calls have taken so far, from its Prometheus metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/monitoring/prometheus/metrics", timeout=30) as reply:
        text = reply.read().decode()
    totals = {}
    for line in text.splitlines():
        if line.startswith((":tensorflow:serving:batch_size_sum", ":tensorflow:serving:batch_size_count")):
            totals[line.split("{")[0].rsplit("_", 1)[1]] = float(line.rsplit(" ", 1)[1])
    return totals.get("sum", 0.0), totals.get("count", 0.0)


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
    parser.add_argument("--requests", type=int, default=5000, help="requests per run (one server, one level)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default=",".join(SERVERS), help="a subset of: " + ", ".join(SERVERS))
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    names = [n.strip() for n in args.servers.split(",")]
    if not all(1 <= c <= 64 for c in levels) or not 100 <= args.requests <= 100_000 or not 1 <= args.rounds <= 9:
        raise SystemExit("concurrency must be 1..64, requests 100..100000, rounds 1..9")
    if "per-request" not in names or not set(names) <= set(SERVERS):
        raise SystemExit(f"servers must include 'per-request' and be among {list(SERVERS)}. Received: {names}")

    import numpy as np

    import tensorfleet as tfl
    from tensorfleet.serving.saved_model import export

    base = Path(tempfile.mkdtemp(prefix="bench-serving-")) / "digits"
    export(tfl.models.build("digits_cnn", seed=0), base, version=1)
    image = tfl.models.datasets.load_digits().x_test[:1].astype(np.float32)
    body = json.dumps({"instances": image.tolist()}).encode()
    load_before = os.getloadavg()
    servers = {name: start_server(base, SERVERS[name]) for name in names}
    results: dict[tuple[str, int], list[tuple[float, ...]]] = {}
    try:
        for name, (_, port) in servers.items():  # warm-up: first calls, connections, kernels
            run_load(port, body, 8, 1000)
        for concurrency in levels:
            for round_ in range(args.rounds):
                for name in names[round_ % len(names):] + names[:round_ % len(names)]:  # rotated each round
                    results.setdefault((name, concurrency), []).append(
                        measure(*servers[name], body, concurrency, args.requests))
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
    report(results, levels, names, args, load_before)


def measure(process: subprocess.Popen, port: int, body: bytes, concurrency: int, requests: int) -> tuple[float, ...]:
    """(requests/s, p50 ms, p99 ms, server CPU us/request, generator CPU us/request, mean batch rows)."""
    cpu, (rows, batches) = server_cpu_seconds(process.pid), batch_totals(port)
    rate, latencies, load_cpu = run_load(port, body, concurrency, requests)
    cpu_us = (server_cpu_seconds(process.pid) - cpu) / len(latencies) * 1e6
    rows_after, batches_after = batch_totals(port)
    mean_batch = (rows_after - rows) / max(batches_after - batches, 1)
    return (rate, percentile(latencies, 0.50) * 1e3, percentile(latencies, 0.99) * 1e3, cpu_us,
            load_cpu / len(latencies) * 1e6, mean_batch)


def ratios(results: dict, name: str, concurrency: int) -> tuple[list[float], list[float]]:
    """Per round: ``name``'s requests/s over per-request's, and its p99 over per-request's."""
    pairs = list(zip(results[(name, concurrency)], results[("per-request", concurrency)]))
    return [r[0] / q[0] for r, q in pairs], [r[2] / q[2] for r, q in pairs]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def report(results: dict, levels: list[int], names: list[str], args: argparse.Namespace,
           load_before: tuple[float, ...]) -> None:
    print(f"tensorfleet serve, digits_cnn, one image per REST :predict, closed loop on 127.0.0.1; "
          f"{args.requests} requests per run, {args.rounds} rounds alternating the servers (order rotated each "
          f"round); {os.cpu_count()} cores shared by the servers, the load generator and whatever else runs "
          f"(load average {load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end). Medians over "
          "rounds. 'server CPU/req' is the server's CPU time per answered request, which other load disturbs "
          "less than requests/s; 'load CPU/req' is the load generator's; 'rows/batch' the mean rows per "
          "signature call (padding included)")
    print(f"{'server':<21}{'concurrency':>12}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'server CPU/req us':>19}"
          f"{'load CPU/req us':>17}{'rows/batch':>12}")
    medians = {}
    for concurrency in levels:
        for name in names:
            runs = results[(name, concurrency)]
            medians[(name, concurrency)] = tuple(statistics.median(r[i] for r in runs) for i in range(6))
            rate, p50, p99, cpu_us, load_us, rows = medians[(name, concurrency)]
            print(f"{name:<21}{concurrency:>12}{rate:>10.0f}{p50:>9.2f}{p99:>9.2f}{cpu_us:>19.0f}{load_us:>17.0f}"
                  f"{rows:>12.1f}")
    for name in names[1:]:
        print(f"{name} / per-request, per round: median (lowest-highest)")
        for concurrency in levels:
            rate, p99 = ratios(results, name, concurrency)
            (_, _, q1, c1, _, _), (_, _, q2, c2, _, _) = (medians[("per-request", concurrency)],
                                                          medians[(name, concurrency)])
            print(f"  concurrency {concurrency:>2}: requests/s {spread(rate)}, p99 {spread(p99)} "
                  f"({q2:.2f} vs {q1:.2f} ms), server CPU per request {c2 / c1:.2f}x")
    if "adaptive batching" in names:
        targets(results, levels)


def targets(results: dict, levels: list[int]) -> None:
    """The issue's targets for the adaptive batcher against per-request calls (medians of the rounds' ratios)."""
    for concurrency in (1, 4):
        if concurrency in levels:
            rate, p99 = ratios(results, "adaptive batching", concurrency)
            met = statistics.median(rate) >= 0.95 and statistics.median(p99) * 0.95 <= 1
            print(f"target at concurrency {concurrency} (adaptive >= 0.95x per-request's requests/s, p99 within "
                  f"1/0.95 of it): {'met' if met else 'not met'} (requests/s {spread(rate)}, p99 {spread(p99)})")
    if 32 in levels:
        rate, p99 = ratios(results, "adaptive batching", 32)
        met = statistics.median(rate) >= 4
        print(f"target at concurrency 32 (adaptive >= 4x the requests/s of per-request): "
              f"{'met' if met else 'not met'} (requests/s {spread(rate)}, p99 {spread(p99)})")


if __name__ == "__main__":
    main()
