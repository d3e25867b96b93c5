"""What an all-reduce sends, by formula: exact per-step and total counts, and the textbook ones.

For N workers of M values each (the algorithms of :mod:`tensorfleet.planner.collectives`):

============================  =====================  =================  =================
algorithm                     total values sent      steps              classic total
============================  =====================  =================  =================
parameter server (``ps``)     2·N·M                  2                  2·N·M
naive all-to-all              N·(N-1)·M              1                  N²·M
ring                          2·(N-1)·M              2·(N-1)            2·N·M
tree (binomial)               2·(N-1)·M              2·⌈log2 N⌉         2·N·M
butterfly (recursive doubling) N·M·log2 N            log2 N             N·M·log2 N
halving_doubling (Rabenseifner) 2·(N-1)·M            2·log2 N           2·N·M
============================  =====================  =================  =================

The classic column is the large-N form; :func:`exact_traffic` and :func:`classic_traffic`
give both, and the counts an executed all-reduce records equal :func:`exact_traffic` exactly.
:func:`step_sizes` is what the alpha-beta model of :mod:`tensorfleet.planner.cost_model`
charges for, step by step.

Example:
    >>> from tensorfleet.planner import traffic
    >>> traffic.exact_traffic("ring", 4, 8), traffic.classic_traffic("ring", 4, 8)
    (48, 64)
"""

from __future__ import annotations

import math

from tensorfleet.planner.collectives import AllReduceAlgorithm, algorithm_name, check_node_count
from tensorfleet.validation import integer, number, positive_int

__all__ = ["classic_per_worker_time", "classic_traffic", "exact_step_values", "exact_traffic", "step_sizes"]


def _check_counts(n: int, m: int) -> tuple[int, int]:
    return integer("n", n, minimum=2), positive_int("m", m)


def step_sizes(algorithm: str | AllReduceAlgorithm, n: int, size: float) -> list[float]:
    """Per-step critical sizes of an all-reduce of ``size`` (values or bytes) on ``n`` >= 2 nodes.

    A step's critical size is the most any one node sends or receives in it. An integer
    ``size`` is shared out by floor division, a float one exactly.

    Example:
        >>> step_sizes("halving_doubling", 4, 8), step_sizes("ring", 4, 6.0)
        ([4, 2, 2, 4], [1.5, 1.5, 1.5, 1.5, 1.5, 1.5])
    """
    name = algorithm_name(algorithm)
    check_node_count(name, n)
    log = math.ceil(math.log2(n))

    def share(parts: int) -> float:
        return size // parts if isinstance(size, int) else size / parts

    if name == "ps":
        return [n * size, n * size]
    if name == "naive":
        return [(n - 1) * size]
    if name == "ring":
        return [share(n)] * (2 * (n - 1))
    if name == "tree":
        return [size] * (2 * log)
    if name == "butterfly":
        return [size] * log
    halving = [share(2 ** (k + 1)) for k in range(log)]
    return halving + halving[::-1]


def exact_step_values(algorithm: str | AllReduceAlgorithm, n: int, m: int) -> list[int]:
    """Per-step critical values of an all-reduce (M divisible by N), without running it.

    Example:
        >>> exact_step_values("ring", 4, 8)
        [2, 2, 2, 2, 2, 2]
    """
    n, m = _check_counts(n, m)
    return step_sizes(algorithm, n, m)  # type: ignore[return-value]


def exact_traffic(algorithm: str | AllReduceAlgorithm, n: int, m: int) -> int:
    """Total values sent by all nodes in one all-reduce of M values on N workers (M divisible by N).

    Example:
        >>> exact_traffic("naive", 4, 10)
        120
    """
    n, m = _check_counts(n, m)
    name = algorithm_name(algorithm)
    check_node_count(name, n)
    return {
        "ps": 2 * n * m,
        "naive": n * (n - 1) * m,
        "ring": 2 * (n - 1) * m,
        "tree": 2 * (n - 1) * m,
        "butterfly": n * m * int(math.log2(n)),
        "halving_doubling": 2 * (n - 1) * m,
    }[name]


def classic_traffic(algorithm: str | AllReduceAlgorithm, n: int, m: int) -> int:
    """The textbook (large-N) total traffic: PS 2NM, naive N²M, ring 2NM, tree 2NM, butterfly NM·log2 N."""
    n, m = _check_counts(n, m)
    name = algorithm_name(algorithm)
    if name == "butterfly":
        return n * m * int(round(math.log2(n)))
    return {"ps": 2 * n * m, "naive": n * n * m, "ring": 2 * n * m, "tree": 2 * n * m,
            "halving_doubling": 2 * n * m}[name]


def classic_per_worker_time(algorithm: str | AllReduceAlgorithm, n: int, m: float, bandwidth: float) -> float:
    """The textbook per-worker time: PS M·N/B, ring (M/N)·2N/B, tree M·2·log2(N)/B, butterfly M·log2(N)/B.

    The step model of :class:`~tensorfleet.planner.collectives.Trace` (push and pull not
    overlapped, N-1 not N ring steps) gives ``critical_values / B``: PS 2·M·N/B, ring
    2·(N-1)·M/(N·B), tree and butterfly exactly as here.
    """
    n = integer("n", n, minimum=2)
    number("m", m, minimum=0)
    number("bandwidth", bandwidth, above=0)
    name = algorithm_name(algorithm)
    log = math.log2(n)
    return {
        "ps": m * n / bandwidth,
        "naive": (n - 1) * m / bandwidth,
        "ring": (m / n) * 2 * n / bandwidth,
        "tree": m * 2 * log / bandwidth,
        "butterfly": m * log / bandwidth,
        "halving_doubling": (m / n) * 2 * n / bandwidth,
    }[name]
