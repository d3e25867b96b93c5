"""Alpha-beta (latency-bandwidth) cost model of collective communication.

Hockney's model: sending a message of ``n`` bytes costs ``alpha + n * beta`` seconds, with
``alpha`` the per-message latency and ``beta = 1 / bandwidth``. An algorithm that runs in
steps costs the sum over its steps of ``alpha + beta * (bytes the busiest node sends or
receives in that step)`` -- the same per-step critical sizes that
:mod:`tensorfleet.strategies.collectives` counts when it executes the algorithm.

The two-level (hierarchical) all-reduce follows Goyal et al. / Horovod's hierarchical mode:
reduce-scatter inside each machine over fast links, all-reduce of each shard across machines
over the slow network, all-gather inside each machine again.

Example:
    >>> from tensorfleet.strategies import cost_model
    >>> link = cost_model.Link.from_strings(latency="5us", bandwidth="100Gbps")
    >>> round(cost_model.predict("ring", 8, 4e8, link) * 1e3, 3)   # 100M fp32 values
    56.07
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from tensorfleet.strategies.collectives import AllReduceAlgorithm, COLLECTIVES

__all__ = [
    "Link",
    "fit_alpha_beta",
    "parse_bandwidth",
    "parse_bytes",
    "parse_duration",
    "predict",
    "predict_hierarchical",
    "step_bytes",
]

_BYTE_UNITS = {
    "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# Network rates: bits per second (b) or bytes per second (B/s); both spellings common.
_BIT_RATE_UNITS = {"bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12,
                   "kbit/s": 1e3, "mbit/s": 1e6, "gbit/s": 1e9, "tbit/s": 1e12, "bit/s": 1}
_BYTE_RATE_UNITS = {"b/s": 1, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
                    "kib/s": 2**10, "mib/s": 2**20, "gib/s": 2**30}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")


def _split(text: str, what: str, example: str) -> tuple[float, str]:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise TypeError(f"{what} must be a string such as {example!r} or a number. Received: {text!r}")
    if isinstance(text, (int, float)):
        if not text >= 0:
            raise ValueError(f"{what} must not be negative. Received: {text!r}")
        return float(text), ""
    stripped = text.strip()
    if stripped.startswith("-"):
        raise ValueError(f"{what} must not be negative. Received: {text!r}")
    match = _NUMBER.match(stripped)
    if not match:
        raise ValueError(f"{what} must be a number with a unit such as {example!r}. Received: {text!r}")
    return float(match.group(1)), match.group(2)


def parse_bytes(text: str | int | float) -> float:
    """Bytes from ``"16GB"``, ``"512MiB"``, ``"1.5e9"`` or a number (decimal GB = 1e9).

    Example:
        >>> parse_bytes("16GB"), parse_bytes("1KiB")
        (16000000000.0, 1024.0)
    """
    value, unit = _split(text, "A memory size", "16GB")
    if unit == "":
        return value
    # "B" alone is bytes; a lone lowercase "b" (bits) is not a memory unit.
    factor = _BYTE_UNITS.get(unit.lower()) if unit[-1] == "B" or unit.lower().endswith("ib") else None
    if factor is None:
        raise ValueError(
            f"Unknown memory unit {unit!r} in {text!r}; use one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB."
        )
    return value * factor


def parse_bandwidth(text: str | int | float) -> float:
    """Bytes per second from ``"100Gbps"``, ``"25Gbit/s"``, ``"10GB/s"`` or a number (bytes/s).

    Example:
        >>> parse_bandwidth("100Gbps"), parse_bandwidth("10GB/s")
        (12500000000.0, 10000000000.0)
    """
    value, unit = _split(text, "A bandwidth", "100Gbps")
    if unit == "":
        rate = value
    elif unit.lower() in _BIT_RATE_UNITS and not unit.endswith("B/s"):
        rate = value * _BIT_RATE_UNITS[unit.lower()] / 8
    elif unit.endswith("B/s") and unit.lower() in _BYTE_RATE_UNITS:
        rate = value * _BYTE_RATE_UNITS[unit.lower()]
    else:
        raise ValueError(
            f"Unknown bandwidth unit {unit!r} in {text!r}; use bits per second (bps, Mbps, Gbps, "
            "Tbps) or bytes per second (B/s, MB/s, GB/s)."
        )
    if rate <= 0:
        raise ValueError(f"A bandwidth must be positive. Received: {text!r}")
    return rate


def parse_duration(text: str | int | float) -> float:
    """Seconds from ``"5us"``, ``"2ms"``, ``"0.1s"`` or a number of seconds.

    Example:
        >>> parse_duration("2ms")
        0.002
    """
    value, unit = _split(text, "A latency", "5us")
    if unit == "":
        return value
    if unit not in _TIME_UNITS:
        raise ValueError(f"Unknown time unit {unit!r} in {text!r}; use one of s, ms, us, ns.")
    return value * _TIME_UNITS[unit]


@dataclass(frozen=True)
class Link:
    """One kind of link: ``alpha`` seconds per message and ``beta`` seconds per byte."""

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
                raise ValueError(f"{name} must be a finite number >= 0. Received: {name}={value!r}")

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        return math.inf if self.beta == 0 else 1.0 / self.beta

    @classmethod
    def from_strings(cls, *, latency: str | float = 0.0, bandwidth: str | float) -> "Link":
        """A link from human units, e.g. ``Link.from_strings(latency="5us", bandwidth="100Gbps")``."""
        return cls(alpha=parse_duration(latency), beta=1.0 / parse_bandwidth(bandwidth))

    def time(self, nbytes: float) -> float:
        """Seconds to send one message of ``nbytes``."""
        return self.alpha + self.beta * nbytes


def _name(algorithm: str | AllReduceAlgorithm) -> str:
    return COLLECTIVES.canonical(algorithm.value if isinstance(algorithm, AllReduceAlgorithm) else algorithm)


def _check(n: int, nbytes: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"The number of workers must be a positive integer. Received: n={n!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not nbytes >= 0:
        raise ValueError(f"The message size must be a number of bytes >= 0. Received: nbytes={nbytes!r}")


def step_bytes(algorithm: str | AllReduceAlgorithm, n: int, nbytes: float) -> list[float]:
    """Per-step critical bytes of an all-reduce of ``nbytes`` on ``n`` workers.

    Equals :func:`tensorfleet.strategies.collectives.exact_step_values` whenever ``nbytes`` is
    divisible by ``n``; one worker needs no communication.

    Example:
        >>> step_bytes("tree", 4, 100.0)
        [100.0, 100.0, 100.0, 100.0]
    """
    _check(n, nbytes)
    name = _name(algorithm)
    if n == 1:
        return []
    if name in ("butterfly", "halving_doubling") and n & (n - 1):
        raise ValueError(f"The {name} algorithm needs a power-of-two number of workers. Received: n={n}")
    log = math.ceil(math.log2(n))
    s = float(nbytes)
    if name == "ps":
        return [n * s, n * s]
    if name == "naive":
        return [(n - 1) * s]
    if name == "ring":
        return [s / n] * (2 * (n - 1))
    if name == "tree":
        return [s] * (2 * log)
    if name == "butterfly":
        return [s] * log
    halving = [s / 2 ** (k + 1) for k in range(log)]
    return halving + halving[::-1]


def predict(algorithm: str | AllReduceAlgorithm, n: int, nbytes: float, link: Link) -> float:
    """Seconds for one all-reduce of ``nbytes`` on ``n`` workers joined by ``link``.

    Example:
        >>> round(predict("ps", 4, 1000.0, Link(alpha=1e-5, beta=1e-9)), 9)
        2.8e-05
    """
    return sum(link.time(b) for b in step_bytes(algorithm, n, nbytes))


def predict_hierarchical(nodes: int, devices_per_node: int, nbytes: float, *, intra: Link, inter: Link) -> float:
    """Two-level ring all-reduce: ring inside each machine, ring across machines per shard.

    ``2(G-1)(a1 + S/G b1)`` for the reduce-scatter and all-gather among the G devices of a
    machine, plus ``2(K-1)(a2 + S/(G K) b2)`` for the G parallel rings across the K machines.

    Example:
        >>> fast, slow = Link(1e-6, 1e-11), Link(1e-5, 1e-9)
        >>> predict_hierarchical(2, 4, 1e6, intra=fast, inter=slow) < predict("ring", 8, 1e6, slow)
        True
    """
    for label, value in (("nodes", nodes), ("devices_per_node", devices_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive integer. Received: {label}={value!r}")
    _check(nodes * devices_per_node, nbytes)
    g, k, s = devices_per_node, nodes, float(nbytes)
    inside = 2 * (g - 1) * intra.time(s / g)
    across = 2 * (k - 1) * inter.time(s / (g * k))
    return inside + across


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
    if np.any(t <= 0):
        raise ValueError(f"Measured times must be positive. Received: {t.tolist()}")
    design = np.stack([k / t, x / t], axis=1)  # divide by t: each row's relative error counts equally
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if alpha < 0 or beta < 0:  # refit with the negative term pinned to zero
        if alpha < 0:
            alpha, beta = 0.0, float(np.sum(x * t / t**2) / np.sum((x / t) ** 2))
        else:
            beta, alpha = 0.0, float(np.sum(k / t) / np.sum((k / t) ** 2))
    return Link(alpha=float(alpha), beta=float(beta))
