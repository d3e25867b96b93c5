"""`tensorfleet serve`: one signature call per request vs fixed-timeout vs adaptive batching, side by side.

The digits CNN (digits_cnn, seed 0) is exported once and served by three `tensorfleet serve`
processes on 127.0.0.1 at the same time: one without batching, one with --enable-batching
--batching-policy timeout (the first request of a batch waits --batch-timeout-micros for others,
as TF Serving's batcher does) and one with --batching-policy adaptive (a batch goes at once unless
another batch is running). A closed-loop load
generator (one event loop, uvloop when installed, CONCURRENCY keep-alive HTTP/1.1 connections,
each sending its next one-image REST :predict as soon as the last is answered, written as raw
bytes so that the generator costs little CPU per request) drives each server for SECONDS at every
concurrency; the servers alternate ROUNDS times at each level and the medians are reported.
Every run stops by itself (duration and request cap; a stuck server fails it 30 s later).
Prints requests/s, p50/p99 latency and the CPU time per request of the server and of the load
generator for each server and concurrency, and the ratios to per-request (targets: adaptive
>= 0.95x per-request's requests/s with p99 no worse than 1/0.95 of it at concurrency 1 and 4, and
>= 4x the requests/s at 32).

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
    "timeout batching": [*BATCHING, "--num-batch-threads", "1", "--batching-policy", "timeout"],
    "adaptive batching": [*BATCHING, "--num-batch-threads", "1", "--batching-policy", "adaptive"],
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


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line[15:])
    return None


class _Caller(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection of the closed loop: the next request goes out as soon as
    the last reply is whole. Raw bytes both ways (one request written once; a reply's end found from
    its Content-Length), so the generator spends as little CPU per request as it can."""

    def __init__(self, request: bytes, stop_at: float, latencies: list[float], done: asyncio.Future) -> None:
        self.request, self.stop_at, self.latencies, self.done = request, stop_at, latencies, done
        self.buffer, self.need, self.start, self.transport = b"", 0, 0.0, None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._send()

    def _send(self) -> None:
        self.start = time.perf_counter()
        self.transport.write(self.request)

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
        now = time.perf_counter()
        self.latencies.append(now - self.start)
        self.buffer, self.need = self.buffer[self.need:], 0
        if now < self.stop_at and len(self.latencies) < MAX_REQUESTS:
            self._send()
        else:
            self._finish(None)

    def _finish(self, error: BaseException | None) -> None:
        if not self.done.done():
            self.done.set_exception(error) if error else self.done.set_result(None)
        self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"the server closed the connection: {exc!r}"))


async def _run_load(port: int, body: bytes, concurrency: int, seconds: float) -> tuple[float, list[float]]:
    loop = asyncio.get_running_loop()
    request = (f"POST /v1/models/digits:predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    latencies: list[float] = []
    began = time.perf_counter()
    stop_at = began + seconds
    dones = [loop.create_future() for _ in range(concurrency)]
    for done in dones:
        await loop.create_connection(lambda d=done: _Caller(request, stop_at, latencies, d), "127.0.0.1", port)
    await asyncio.wait_for(asyncio.gather(*dones), seconds + 30)  # a stuck server fails the run, bounded
    return len(latencies) / (time.perf_counter() - began), latencies


def run_load(port: int, body: bytes, concurrency: int, seconds: float) -> tuple[float, list[float], float]:
    """(requests/s, latencies in seconds, the generator's CPU seconds) of ``concurrency`` closed-loop
    callers for ``seconds``, on uvloop when it is installed."""
    from tensorfleet.serving.rest import new_event_loop  # the server's own choice of loop

    cpu = time.process_time()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        rate, latencies = runner.run(_run_load(port, body, concurrency, seconds))
    return rate, latencies, time.process_time() - cpu


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
    results: dict[tuple[str, int], list[tuple[float, ...]]] = {}
    try:
        for name, (_, port) in servers.items():  # warm-up: first calls, connections, kernels
            run_load(port, body, 8, 1.0)
        for concurrency in levels:
            for _ in range(args.rounds):
                for name, (process, port) in servers.items():
                    cpu = server_cpu_seconds(process.pid)
                    rate, latencies, load_cpu = run_load(port, body, concurrency, args.seconds)
                    cpu_us = (server_cpu_seconds(process.pid) - cpu) / len(latencies) * 1e6
                    results.setdefault((name, concurrency), []).append(
                        (rate, percentile(latencies, 0.50) * 1e3, percentile(latencies, 0.99) * 1e3, cpu_us,
                         load_cpu / len(latencies) * 1e6))
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
          "load on the machine disturbs less than requests/s; 'load CPU/req' is the load generator's")
    print(f"{'server':<21}{'concurrency':>12}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'server CPU/req us':>19}"
          f"{'load CPU/req us':>17}")
    medians = {}
    for concurrency in levels:
        for name in SERVERS:
            runs = results[(name, concurrency)]
            medians[(name, concurrency)] = tuple(statistics.median(r[i] for r in runs) for i in range(5))
            rate, p50, p99, cpu_us, load_us = medians[(name, concurrency)]
            print(f"{name:<21}{concurrency:>12}{rate:>10.0f}{p50:>9.2f}{p99:>9.2f}{cpu_us:>19.0f}{load_us:>17.0f}")
    for name in list(SERVERS)[1:]:
        print(f"{name} / per-request:")
        for concurrency in levels:
            (r1, _, q1, c1, _), (r2, _, q2, c2, _) = medians[("per-request", concurrency)], medians[(name, concurrency)]
            print(f"  concurrency {concurrency:>2}: {r2 / r1:.2f}x requests/s, p99 {q2:.2f} ms vs {q1:.2f} ms, "
                  f"server CPU per request {c2 / c1:.2f}x")
    targets(medians, levels)


def targets(medians: dict, levels: list[int]) -> None:
    """The issue's targets for the adaptive batcher against per-request calls."""
    for concurrency in (1, 4):
        if concurrency in levels:
            (r1, _, q1, _, _), (r2, _, q2, _, _) = (medians[("per-request", concurrency)],
                                                    medians[("adaptive batching", concurrency)])
            met = r2 >= 0.95 * r1 and q2 * 0.95 <= q1
            print(f"target at concurrency {concurrency} (adaptive >= 0.95x per-request's requests/s, p99 within "
                  f"1/0.95 of it): {'met' if met else 'not met'} ({r2 / r1:.2f}x, p99 {q2:.2f} vs {q1:.2f} ms)")
    if 32 in levels:
        (r1, _, q1, _, _), (r2, _, q2, _, _) = medians[("per-request", 32)], medians[("adaptive batching", 32)]
        met = r2 >= 4 * r1
        print(f"target at concurrency 32 (adaptive >= 4x the requests/s of per-request): "
              f"{'met' if met else 'not met'} ({r2 / r1:.2f}x, p99 {q2:.2f} vs {q1:.2f} ms)")


if __name__ == "__main__":
    main()
