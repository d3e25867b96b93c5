"""Alpha-beta (latency-bandwidth) cost model of collective communication.

Hockney's model: sending a message of ``n`` bytes costs ``alpha + n * beta`` seconds, with
``alpha`` the per-message latency and ``beta = 1 / bandwidth``. An algorithm that runs in
steps costs the sum over its steps of ``alpha + beta * (bytes the busiest node sends or
receives in that step)`` -- the same per-step critical sizes that
:mod:`tensorfleet.planner.collectives` counts when it executes the algorithm
(:func:`tensorfleet.planner.traffic.step_sizes`).

The two-level (hierarchical) all-reduce follows Goyal et al. / Horovod's hierarchical mode:
reduce-scatter inside each machine over fast links, all-reduce of each shard across machines
over the slow network, all-gather inside each machine again.

A link may also know a cache (a size-dependent cost in the spirit of Kielmann et al.'s
parameterised LogP, 2000): while the buffer a replica reduces and then sends again fits the
cache, bytes cost ``beta``; once it does not, every byte costs ``beta_uncached``. It is a cliff,
not a slope, because a collective streams through its buffers in order, and a cyclic scan of
more data than an LRU cache holds evicts each line before it is reused, so the hit rate falls
to zero (Mattson et al., 1970). Devices of one process that copy through memory see it; links
far slower than memory (gRPC between processes, networks) do not, and take no cache term
(``bench/collectives.py`` measures both).

Example:
    >>> from tensorfleet.planner import cost_model
    >>> link = cost_model.Link.from_strings(latency="5us", bandwidth="100Gbps")
    >>> round(cost_model.predict("ring", 8, 4e8, link) * 1e3, 3)   # 100M fp32 values
    56.07
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from tensorfleet.planner.collectives import AllReduceAlgorithm, algorithm_name
from tensorfleet.planner.traffic import step_sizes
from tensorfleet.validation import number, parse_bandwidth, parse_duration, positive_int

__all__ = [
    "Link",
    "fit_alpha_beta",
    "fit_link",
    "fit_support",
    "last_level_cache_bytes",
    "predict",
    "predict_hierarchical",
    "predict_parameter_server",
    "step_bytes",
]

@dataclass(frozen=True)
class Link:
    """One kind of link: ``alpha`` seconds per message and ``beta`` seconds per byte.

    With ``cache_bytes`` and ``beta_uncached`` the link is cache-aware: a collective whose
    working set exceeds ``cache_bytes`` costs ``beta_uncached`` per byte instead of ``beta``
    (see the module docstring).
    """

    alpha: float
    beta: float
    cache_bytes: float | None = None
    beta_uncached: float | None = None

    def __post_init__(self) -> None:
        number("alpha", self.alpha, minimum=0)
        number("beta", self.beta, minimum=0)
        if (self.cache_bytes is None) != (self.beta_uncached is None):
            raise ValueError(
                "A cache-aware link needs both cache_bytes and beta_uncached (or neither). Received: "
                f"cache_bytes={self.cache_bytes!r}, beta_uncached={self.beta_uncached!r}"
            )
        if self.cache_bytes is not None:
            number("cache_bytes", self.cache_bytes, minimum=0)
            number("beta_uncached", self.beta_uncached, minimum=0)

    @property
    def bandwidth(self) -> float:
        """Bytes per second (from cache, for a cache-aware link)."""
        return math.inf if self.beta == 0 else 1.0 / self.beta

    @classmethod
    def from_strings(cls, *, latency: str | float = 0.0, bandwidth: str | float) -> "Link":
        """A link from human units, e.g. ``Link.from_strings(latency="5us", bandwidth="100Gbps")``."""
        return cls(alpha=parse_duration(latency), beta=1.0 / parse_bandwidth(bandwidth))

    def beyond_cache(self, working_set: float | None) -> bool:
        """Whether a collective of ``working_set`` bytes misses the cache (never, without one)."""
        return self.cache_bytes is not None and working_set is not None and working_set > self.cache_bytes

    def time(self, nbytes: float, working_set: float | None = None) -> float:
        """Seconds to send one message of ``nbytes`` within a collective of ``working_set`` bytes."""
        beta = self.beta_uncached if self.beyond_cache(working_set) else self.beta
        assert beta is not None  # a link with cache_bytes has beta_uncached (__post_init__)
        return self.alpha + beta * nbytes


def step_bytes(algorithm: str | AllReduceAlgorithm, n: int, nbytes: float) -> list[float]:
    """Per-step critical bytes of an all-reduce of ``nbytes`` on ``n`` workers.

    Equals :func:`tensorfleet.planner.traffic.exact_step_values` whenever ``nbytes`` is
    divisible by ``n``; one worker needs no communication.

    Example:
        >>> step_bytes("tree", 4, 100.0)
        [100.0, 100.0, 100.0, 100.0]
    """
    n = positive_int("n", n)
    nbytes = number("nbytes", nbytes, minimum=0)
    name = algorithm_name(algorithm)
    return [] if n == 1 else step_sizes(name, n, nbytes)


def predict(
    algorithm: str | AllReduceAlgorithm, n: int, nbytes: float, link: Link, *, working_set: float | None = None
) -> float:
    """Seconds for one all-reduce of ``nbytes`` on ``n`` workers joined by ``link``.

    Args:
        working_set: the bytes that must stay in ``link``'s cache between a replica's
            reduction and its next send; only a cache-aware link reads it. Default
            ``nbytes``: the replica's buffer.

    Example:
        >>> round(predict("ps", 4, 1000.0, Link(alpha=1e-5, beta=1e-9)), 9)
        2.8e-05
    """
    steps = step_bytes(algorithm, n, nbytes)
    shared = float(nbytes) if working_set is None else working_set
    return sum(link.time(b, shared) for b in steps)


def compression_ratio(compression: str | None, shapes: Sequence[Sequence[int]], value_bytes: int) -> float:
    """How many times fewer bytes the gradients of ``shapes`` (``value_bytes`` each) hand the all-reduce under
    ``compression`` (the ``compression`` option of :mod:`tensorfleet.strategies.compression`; None: 1).

    Example (the digits CNN's weights; the launch benchmark measures the same bytes):
        >>> shapes = [(3, 3, 1, 16), (16,), (3, 3, 16, 32), (32,), (512, 64), (64,), (64, 10), (10,)]
        >>> round(compression_ratio("powersgd:rank=2", shapes, 4), 3), compression_ratio("fp16", shapes, 4)
        (20.988, 2.0)
    """
    from tensorfleet.strategies.compression import compressed_bytes

    if compression is None:
        return 1.0
    return compressed_bytes("none", shapes, value_bytes) / compressed_bytes(compression, shapes, value_bytes)


def predict_parameter_server(workers: int, servers: int, nbytes: float, link: Link) -> float:
    """Seconds for ``workers`` to push ``nbytes`` of gradients to ``servers`` and pull the weights back.

    Two steps (push, then pull), each as long as the busiest end: a server takes ``workers /
    servers`` shards of ``nbytes / servers``, a worker sends all ``nbytes``. With one server this
    is :func:`predict` of ``"ps"``; unlike an all-reduce, one worker still communicates.

    Example:
        >>> link = Link(alpha=1e-5, beta=1e-9)
        >>> round(predict_parameter_server(1, 1, 1000.0, link), 9)   # one worker: 2 (alpha + M beta)
        2.2e-05
        >>> predict_parameter_server(4, 1, 1000.0, link) == predict("ps", 4, 1000.0, link)
        True
    """
    workers, servers = positive_int("workers", workers), positive_int("servers", servers)
    nbytes = number("nbytes", nbytes, minimum=0)
    return 2 * link.time(max(workers / servers, 1.0) * nbytes)


def predict_hierarchical(nodes: int, devices_per_node: int, nbytes: float, *, intra: Link, inter: Link) -> float:
    """Two-level ring all-reduce: ring inside each machine, ring across machines per shard.

    ``2(G-1)(a1 + S/G b1)`` for the reduce-scatter and all-gather among the G devices of a
    machine, plus ``2(K-1)(a2 + S/(G K) b2)`` for the G parallel rings across the K machines.

    Example:
        >>> fast, slow = Link(1e-6, 1e-11), Link(1e-5, 1e-9)
        >>> predict_hierarchical(2, 4, 1e6, intra=fast, inter=slow) < predict("ring", 8, 1e6, slow)
        True
    """
    k, g = positive_int("nodes", nodes), positive_int("devices_per_node", devices_per_node)
    s = number("nbytes", nbytes, minimum=0)
    inside = 2 * (g - 1) * intra.time(s / g)
    across = 2 * (k - 1) * inter.time(s / (g * k))
    return inside + across


def _relative_nnls(rows: Any, seconds: Any) -> Any:
    """Non-negative least squares of ``rows @ coef ≈ seconds`` in relative error.

    Each row is divided by its time, so every measurement's relative error counts equally
    whatever its size.
    """
    import numpy as np
    from scipy.optimize import nnls

    if np.any(~np.isfinite(seconds)) or np.any(seconds <= 0):
        raise ValueError(f"Measured times must be positive. Received: {seconds.tolist()}")
    coef, _ = nnls(rows / seconds[:, None], np.ones_like(seconds))
    return coef


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float], *, steps: Sequence[int] | None = None) -> Link:
    """Least-squares fit of ``seconds ≈ steps·alpha + bytes·beta``, minimising relative error.

    Args:
        nbytes: the critical bytes of each measurement (summed over its steps).
        seconds: the measured times.
        steps: sequential steps of each measurement (default 1 each).

    Example:
        >>> link = fit_alpha_beta([1e3, 1e6], [1e-5 + 1e-6, 1e-5 + 1e-3])
        >>> round(link.alpha * 1e5, 6), round(link.beta * 1e9, 6)
        (1.0, 1.0)
    """
    import numpy as np

    x = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    k = np.ones_like(x) if steps is None else np.asarray(steps, dtype=float)
    if x.shape != t.shape or x.shape != k.shape or x.size < 2:
        raise ValueError(
            f"fit_alpha_beta needs at least 2 measurements of matching lengths. Received: "
            f"{x.size} sizes, {t.size} times, {k.size} step counts"
        )
    alpha, beta = _relative_nnls(np.stack([k, x], axis=1), t)
    return Link(alpha=float(alpha), beta=float(beta))


def fit_link(
    algorithm: str | AllReduceAlgorithm,
    n: int,
    nbytes: Sequence[float],
    seconds: Sequence[float],
    *,
    cache_bytes: float | None = None,
    working_sets: Sequence[float] | None = None,
) -> Link:
    """Fit the link behind measured all-reduces of ``nbytes`` on ``n`` workers.

    Non-negative least squares on relative error (each measurement counts equally whatever its
    size) of ``seconds ≈ steps·alpha + bytes·beta`` for measurements whose working set fits
    ``cache_bytes`` and ``steps·alpha + bytes·beta_uncached`` for the others (see
    :meth:`Link.beyond_cache`). Without ``cache_bytes`` this is the plain alpha-beta fit.

    Args:
        algorithm, n: the algorithm whose per-step sizes (:func:`step_bytes`) the measurements follow.
        nbytes: tensor size of each measurement.
        seconds: measured time of each.
        cache_bytes: the cache (e.g. :func:`last_level_cache_bytes`), or None for no cache term.
        working_sets: working set of each measurement (default its size, as in :func:`predict`).

    Example:
        >>> true = Link(alpha=1e-4, beta=1e-10, cache_bytes=2**25, beta_uncached=3e-10)
        >>> sizes = [2.0**k for k in range(10, 30, 2)]
        >>> link = fit_link("ps", 4, sizes, [predict("ps", 4, s, true) for s in sizes], cache_bytes=2**25)
        >>> round(link.alpha * 1e4, 6), round(link.beta * 1e10, 6), round(link.beta_uncached * 1e10, 6)
        (1.0, 1.0, 3.0)
    """
    import numpy as np

    x = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    w = x if working_sets is None else np.asarray(working_sets, dtype=float)
    if x.ndim != 1 or x.shape != t.shape or x.shape != w.shape:
        raise ValueError(
            f"fit_link needs one time and one working set per size. Received: {x.size} sizes, "
            f"{t.size} times, {w.size} working sets"
        )
    if cache_bytes is not None:
        number("cache_bytes", cache_bytes, minimum=0)
        if not np.any(w > cache_bytes):
            raise ValueError(
                f"No measurement's working set exceeds the cache, so its cost beyond the cache cannot be "
                f"fitted. Received: largest working set {int(w.max())} B, cache_bytes={cache_bytes!r}; "
                f"measure a larger size or pass cache_bytes=None"
            )
    design = np.asarray(_design(algorithm, n, x, w, cache_bytes))
    if design.shape[0] < design.shape[1]:
        raise ValueError(
            f"fit_link needs at least {design.shape[1]} measurements for {design.shape[1]} parameters. "
            f"Received: {design.shape[0]}"
        )
    coef = _relative_nnls(design, t)
    if cache_bytes is not None:
        return Link(alpha=float(coef[0]), beta=float(coef[1]), cache_bytes=float(cache_bytes),
                    beta_uncached=float(coef[2]))
    return Link(alpha=float(coef[0]), beta=float(coef[1]))


def _design(algorithm: str | AllReduceAlgorithm, n: int, nbytes: Any, working_sets: Any,
            cache_bytes: float | None) -> list[list[float]]:
    """One row per measurement: its steps (alpha's column), its bytes within the cache (beta's)
    and, for a cache-aware fit, its bytes beyond the cache (beta_uncached's)."""
    cached = cache_bytes is not None
    probe = Link(0.0, 0.0, cache_bytes, 0.0) if cached else Link(0.0, 0.0)
    rows = []
    for size, shared in zip(nbytes, working_sets):
        steps = step_bytes(algorithm, n, float(size))
        beyond = probe.beyond_cache(float(shared))
        rows.append([len(steps), 0.0 if beyond else sum(steps), sum(steps) if beyond else 0.0][: 3 if cached else 2])
    return rows


def fit_support(
    algorithm: str | AllReduceAlgorithm,
    n: int,
    nbytes: Sequence[float],
    *,
    cache_bytes: float | None = None,
    working_sets: Sequence[float] | None = None,
) -> dict[str, tuple[float, ...]]:
    """The sizes that inform each parameter :func:`fit_link` fits from measurements of ``nbytes``.

    ``alpha`` is informed by every size, ``beta`` by those within the cache and
    ``beta_uncached`` by those beyond it. A parameter informed by one size alone is decided by
    it: the fit passes through that point, so its error there is zero by construction and
    says nothing about the model.

    Example:
        >>> fit_support("ps", 4, [2.0**10, 2.0**20, 2.0**26], cache_bytes=2**25)["beta_uncached"]
        (67108864.0,)
    """
    sizes = [float(s) for s in nbytes]
    shared = sizes if working_sets is None else [float(w) for w in working_sets]
    if len(shared) != len(sizes):
        raise ValueError(f"fit_support needs one working set per size. Received: {len(sizes)} sizes, "
                         f"{len(shared)} working sets")
    names = ("alpha", "beta", "beta_uncached")[: 2 if cache_bytes is None else 3]
    rows = _design(algorithm, n, sizes, shared, cache_bytes)
    return {name: tuple(s for s, row in zip(sizes, rows) if row[i]) for i, name in enumerate(names)}


def _parse_cache_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if not match:
        raise ValueError(f"Unreadable cache size {text!r}; expected e.g. '32768K'.")
    return int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)]


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Size of the largest-level data or unified cache of CPU 0, from Linux sysfs; None if unknown.

    Example:
        >>> last_level_cache_bytes("/nonexistent") is None
        True
    """
    import os

    best: tuple[int, int] | None = None
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(root, entry, "level")) as f:
                level = int(f.read())
            with open(os.path.join(root, entry, "size")) as f:
                size = _parse_cache_size(f.read())
        except (OSError, ValueError):
            continue
        if kind in ("Unified", "Data") and (best is None or level > best[0]):
            best = (level, size)
    return None if best is None else best[1]
