"""The server's metrics in Prometheus' text format, at TF Serving's path ``/monitoring/prometheus/metrics``.

Named after TF Serving's own (``:tensorflow:serving:request_count``, ``...:request_latency`` in
microseconds) plus the batcher's batch sizes and queue depth, the requests in flight and, with
replicas, the replicas per version, the replica-seconds spent so far, the cold starts (a call that
found no replica) and their durations in seconds.
Counting is a few additions under a lock; the text is made only when scraped.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

__all__ = ["BATCH_BUCKETS", "COLD_START_BUCKETS_S", "Histogram", "LATENCY_BUCKETS_US", "ServingMetrics"]

LATENCY_BUCKETS_US = (100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
COLD_START_BUCKETS_S = (0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30)
_PREFIX = ":tensorflow:serving:"


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}" if pairs else ""


class Histogram:
    """Cumulative buckets, a sum and a count, as Prometheus histograms are exposed.

    Example:
        >>> h = Histogram((1, 10))
        >>> h.observe(0.5); h.observe(7); h.observe(50)
        >>> print("\\n".join(h.lines("x", [("api", "rest")])))
        x_bucket{api="rest",le="1"} 1
        x_bucket{api="rest",le="10"} 2
        x_bucket{api="rest",le="+Inf"} 3
        x_sum{api="rest"} 57.5
        x_count{api="rest"} 3
    """

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str, labels: Sequence[tuple[str, str]]) -> list[str]:
        out, total = [], 0
        for bound, count in zip([*map(lambda b: f"{b:g}", self.buckets), "+Inf"], self.counts):
            total += count
            out.append(f"{name}_bucket{_labels([*labels, ('le', bound)])} {total}")
        return out + [f"{name}_sum{_labels(labels)} {self.sum:g}", f"{name}_count{_labels(labels)} {total}"]


class ServingMetrics:
    """Request counts and latencies by API and status, batch sizes and the batch queue's depth."""

    def __init__(self, model_name: str, *, queue_depth: Callable[[], int] | None = None,
                 in_flight: Callable[[], int] | None = None,
                 pools: Callable[[], Mapping[int, Any]] | None = None) -> None:
        self.model_name = model_name
        self.pools = pools or dict
        self.queue_depth = queue_depth or (lambda: 0)
        self.in_flight = in_flight or (lambda: 0)
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.latency: dict[str, Histogram] = {}
        self.batch_sizes = Histogram(BATCH_BUCKETS)

    def observe_request(self, api: str, status: str, seconds: float, model: str | None = None) -> None:
        """One answered request: its front (``rest``/``grpc``), its status (``OK`` or a code name), its latency."""
        with self._lock:
            self.requests[(api, status)] += 1
            histogram = self.latency.get(api)
            if histogram is None:
                histogram = self.latency[api] = Histogram(LATENCY_BUCKETS_US)
            histogram.observe(seconds * 1e6)

    def observe_batch(self, rows: int) -> None:
        with self._lock:
            self.batch_sizes.observe(rows)

    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        model = ("model_name", self.model_name)
        lines = [f"# TYPE {_PREFIX}request_count counter"]
        with self._lock:
            lines += [f"{_PREFIX}request_count{_labels([model, ('entrypoint', api), ('status', status)])} {count}"
                      for (api, status), count in sorted(self.requests.items())]
            lines.append(f"# TYPE {_PREFIX}request_latency histogram")
            for api, histogram in sorted(self.latency.items()):
                lines += histogram.lines(f"{_PREFIX}request_latency", [model, ("entrypoint", api)])
            lines.append(f"# TYPE {_PREFIX}batch_size histogram")
            lines += self.batch_sizes.lines(f"{_PREFIX}batch_size", [model])
        lines += [f"# TYPE {_PREFIX}queue_depth gauge", f"{_PREFIX}queue_depth{_labels([model])} {self.queue_depth()}",
                  f"# TYPE {_PREFIX}requests_in_flight gauge",
                  f"{_PREFIX}requests_in_flight{_labels([model])} {self.in_flight()}"]
        return "\n".join(lines + self._replica_lines(model)) + "\n"

    def _replica_lines(self, model: tuple[str, str]) -> list[str]:
        """Replicas per version, replica-seconds, cold starts and their durations (none without replicas)."""
        pools = sorted(self.pools().items())
        if not pools:
            return []
        lines = [f"# TYPE {_PREFIX}replicas gauge"]
        lines += [f"{_PREFIX}replicas{_labels([model, ('version', str(v))])} {p.size}" for v, p in pools]
        lines.append(f"# TYPE {_PREFIX}replica_seconds_total counter")
        lines += [f"{_PREFIX}replica_seconds_total{_labels([model, ('version', str(v))])} {p.replica_seconds():.3f}"
                  for v, p in pools]
        lines.append(f"# TYPE {_PREFIX}cold_starts_total counter")
        lines += [f"{_PREFIX}cold_starts_total{_labels([model, ('version', str(v))])} {len(p.cold_starts)}"
                  for v, p in pools]
        lines.append(f"# TYPE {_PREFIX}cold_start_seconds histogram")
        for version, pool in pools:
            histogram = Histogram(COLD_START_BUCKETS_S)
            for _, seconds in list(pool.cold_starts):
                histogram.observe(seconds)
            lines += histogram.lines(f"{_PREFIX}cold_start_seconds", [model, ("version", str(version))])
        return lines
