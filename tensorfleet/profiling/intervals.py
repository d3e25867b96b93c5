"""Time intervals as sorted, disjoint ``(start, end)`` pairs: union, intersection, difference.

The breakdown of a step is set arithmetic on the busy intervals of its threads (ops on several
threads overlap; a collective that runs while ops compute is hidden). These small pure functions
do that arithmetic, so it can be checked with plain numbers.

Example:
    >>> a = union([(0, 4), (2, 6), (8, 9)])
    >>> a
    [(0, 6), (8, 9)]
    >>> length(intersect(a, [(5, 8.5)])), length(subtract(a, [(5, 8.5)]))
    (1.5, 5.5)
"""

from __future__ import annotations

from typing import Iterable, Sequence

__all__ = ["Intervals", "union", "intersect", "subtract", "length", "clip"]

Intervals = list[tuple[float, float]]


def union(spans: Iterable[tuple[float, float]]) -> Intervals:
    """The sorted, disjoint union of ``spans`` (empty and reversed spans are dropped)."""
    merged: Intervals = []
    for start, end in sorted((s, e) for s, e in spans if e > s):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersect(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> Intervals:
    """The parts of the disjoint, sorted ``a`` that lie in the disjoint, sorted ``b``."""
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> Intervals:
    """The parts of the disjoint, sorted ``a`` outside the disjoint, sorted ``b``."""
    out: Intervals = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def clip(spans: Iterable[tuple[float, float]], start: float, end: float) -> Intervals:
    """The union of ``spans`` cut to the window ``[start, end]``."""
    return intersect(union(spans), [(start, end)])


def length(spans: Iterable[tuple[float, float]]) -> float:
    """Total time covered by disjoint ``spans``."""
    return float(sum(e - s for s, e in spans))
