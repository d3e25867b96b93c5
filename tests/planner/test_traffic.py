"""The traffic formulas: exact counts against the classic table, per-worker times, bad counts."""

from __future__ import annotations

import math

import pytest

from tensorfleet.planner import traffic as T


@pytest.mark.parametrize("n", [2, 4, 8])
def test_exact_traffic_formulas_and_the_classic_table(n):
    m = 1000 * n
    log = int(math.log2(n))
    assert T.exact_traffic("ps", n, m) == 2 * n * m == T.classic_traffic("ps", n, m)
    assert T.exact_traffic("naive", n, m) == n * (n - 1) * m
    assert T.classic_traffic("naive", n, m) == n * n * m
    assert T.exact_traffic("ring", n, m) == 2 * (n - 1) * m
    assert T.classic_traffic("ring", n, m) == 2 * n * m
    assert T.exact_traffic("tree", n, m) == 2 * (n - 1) * m
    assert T.classic_traffic("tree", n, m) == 2 * n * m
    assert T.exact_traffic("butterfly", n, m) == n * m * log == T.classic_traffic("butterfly", n, m)
    assert T.exact_traffic("halving_doubling", n, m) == 2 * (n - 1) * m
    # Ring, tree and naive differ from the textbook only by the factor (N-1)/N.
    for name in ("naive", "ring", "tree"):
        assert T.exact_traffic(name, n, m) * n == T.classic_traffic(name, n, m) * (n - 1)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_per_worker_times_match_the_classic_formulas(n):
    m, b = 8000.0 * n, 1e6
    log = math.log2(n)
    assert T.classic_per_worker_time("ps", n, m, b) == pytest.approx(m * n / b)
    assert T.classic_per_worker_time("ring", n, m, b) == pytest.approx((m / n) * 2 * n / b)
    assert T.classic_per_worker_time("tree", n, m, b) == pytest.approx(m * 2 * log / b)
    mi = int(m)
    # The step model: tree and butterfly equal the classic time; the ring's N-1 steps give
    # (N-1)/N of it; the PS, pushing then pulling without overlap, twice it.
    assert sum(T.exact_step_values("tree", n, mi)) / b == pytest.approx(T.classic_per_worker_time("tree", n, m, b))
    assert sum(T.exact_step_values("butterfly", n, mi)) / b == pytest.approx(m * log / b)
    assert sum(T.exact_step_values("ring", n, mi)) / b == pytest.approx(
        T.classic_per_worker_time("ring", n, m, b) * (n - 1) / n)
    assert sum(T.exact_step_values("ps", n, mi)) / b == pytest.approx(2 * T.classic_per_worker_time("ps", n, m, b))


def test_step_sizes_share_integers_by_floor_and_floats_exactly():
    assert T.step_sizes("ring", 4, 10) == [2] * 6
    assert T.step_sizes("ring", 4, 10.0) == [2.5] * 6
    assert T.step_sizes("rabenseifner", 8, 16.0) == [8.0, 4.0, 2.0, 2.0, 4.0, 8.0]


def test_bad_counts_raise_clear_errors():
    with pytest.raises(ValueError, match="n must be an integer >= 2. Received: n=1"):
        T.exact_traffic("ring", 1, 10)
    with pytest.raises(ValueError, match="m must be a positive integer. Received: m=0"):
        T.exact_step_values("ring", 4, 0)
    with pytest.raises(ValueError, match="power-of-two number of nodes. Received: N=6"):
        T.exact_traffic("butterfly", 6, 12)
    with pytest.raises(ValueError, match="bandwidth must be a finite number > 0. Received: bandwidth=0"):
        T.classic_per_worker_time("ring", 4, 10, 0)
