"""Who shares masks with whom. SecAgg (Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning", CCS 2017): every pair of a round's clients. SecAgg+ (Bell,
Bonawitz, Gascon, Lepoint and Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead", CCS 2020): a random k-regular graph of degree ``k = O(log n)``; here a ring of the
clients in a random order, each joined to the ``k / 2`` nearest on either side (a random
circulant graph, as their "Harary graph" construction), so costs per client grow with ``log n``.

Example:
    >>> graph = neighbours(10, degree=4, seed=0)
    >>> sorted(len(graph[u]) for u in range(10)) == [4] * 10
    True
    >>> all(u in graph[v] for u in range(10) for v in graph[u])
    True
    >>> default_degree(1000)
    20
"""

from __future__ import annotations

import math

import numpy as np

from tensorfleet.validation import integer

__all__ = ["default_degree", "neighbours"]


def default_degree(clients: int) -> int:
    """SecAgg+'s degree for ``clients``: ``2 * ceil(log2 n)`` (even), at most ``n - 1``."""
    n = integer("clients", clients, minimum=1)
    return min(n - 1, 2 * math.ceil(math.log2(n))) if n > 1 else 0


def neighbours(clients: int, *, degree: int | None, seed: int) -> list[frozenset[int]]:
    """Each client's neighbours: every other client (``degree=None``, SecAgg) or a random
    ``degree``-regular circulant graph drawn from ``seed`` (SecAgg+; ``degree`` even, < ``clients``;
    ``clients - 1`` makes the complete graph)."""
    n = integer("clients", clients, minimum=1)
    if degree is None or degree >= n - 1:
        if degree is not None and degree > n - 1:
            raise ValueError(f"degree must be at most clients - 1 = {n - 1}. Received: degree={degree}")
        return [frozenset(range(n)) - {u} for u in range(n)]
    integer("degree", degree, minimum=2)
    if degree % 2:
        raise ValueError(f"degree must be even (a ring joins each client to degree / 2 on either side). "
                         f"Received: degree={degree}")
    order = np.random.default_rng(seed).permutation(n)
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    half = degree // 2
    return [frozenset(int(order[(position[u] + step) % n]) for step in range(-half, half + 1) if step)
            for u in range(n)]
