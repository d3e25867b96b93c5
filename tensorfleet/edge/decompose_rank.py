"""Choosing the rank of a factored layer: by retained energy, by VBMF, or by a fitted CP error.

Energy is the share of the squared singular values kept (Denton et al., 2014): for a matrix
``W`` with singular values ``s``, the smallest ``r`` with ``sum(s[:r]**2) >= energy * sum(s**2)``.
For Tucker-2 it is applied to each unfolding of the kernel (input and output channels) apart.

VBMF is the analytic empirical variational Bayesian matrix factorization of Nakajima et al.
("Global analytic solution of fully-observed variational Bayesian matrix factorization", JMLR
2013), as Kim et al. ("Compression of Deep Convolutional Neural Networks for Fast and Low Power
Mobile Applications", ICLR 2016) use it: the noise variance is estimated by minimising the
free energy, and the rank is the number of singular values above the threshold it implies.

A CP decomposition has no singular spectrum, so its energy is the fitted share
``1 - ||K - K_r||^2 / ||K||^2`` of the kernel's squared norm, and the rank is the smallest that
reaches it (found by bisection, each step one TensorLy ``parafac``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["energy_rank", "vbmf_rank", "smallest_rank", "cp_energy"]


def energy_rank(matrix: np.ndarray, energy: float) -> int:
    """The smallest rank whose singular values keep ``energy`` of the squared total (at least 1).

    Example:
        >>> energy_rank(np.diag([3.0, 1.0, 0.0]), 0.9)
        1
        >>> energy_rank(np.diag([3.0, 1.0, 0.0]), 1.0)
        2
    """
    s2 = np.linalg.svd(np.asarray(matrix, np.float64), compute_uv=False) ** 2
    total = float(s2.sum())
    if total == 0.0:
        return 1
    cumulative = np.cumsum(s2) / total
    # Rounding may leave the last cumulative share a hair below 1: energy 1.0 keeps every nonzero value.
    if energy >= 1.0:
        return max(1, int(np.count_nonzero(s2 > s2[0] * 1e-24)))
    return min(int(np.searchsorted(cumulative, energy)) + 1, len(s2))


def _tau(x: np.ndarray, alpha: float) -> np.ndarray:
    return 0.5 * (x - (1 + alpha) + np.sqrt((x - (1 + alpha)) ** 2 - 4 * alpha))


def _free_energy(sigma2: float, shape: tuple[int, int], s: np.ndarray, residual: float, xubar: float) -> float:
    rows, cols = shape
    alpha = rows / cols
    x = s ** 2 / (cols * sigma2)
    above, below = x[x > xubar], x[x <= xubar]
    tau_above = _tau(above, alpha)
    return float(np.sum(below - np.log(below)) + np.sum(above - tau_above)
                 + np.sum(np.log((tau_above + 1) / above)) + alpha * np.sum(np.log(tau_above / alpha + 1))
                 + residual / (cols * sigma2) + (rows - len(s)) * np.log(sigma2))


def vbmf_rank(matrix: np.ndarray) -> int:
    """The rank analytic empirical VBMF (Nakajima et al., 2013) keeps, at least 1.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> low = rng.normal(size=(40, 3)) @ rng.normal(size=(3, 60))
        >>> vbmf_rank(low + 0.01 * rng.normal(size=(40, 60)))
        3
    """
    from scipy.optimize import minimize_scalar

    y = np.asarray(matrix, np.float64)
    if y.shape[0] > y.shape[1]:
        y = y.T
    rows, cols = y.shape
    s = np.linalg.svd(y, compute_uv=False)
    if rows < 2 or not np.any(s > 0):
        return 1
    alpha = rows / cols
    tauubar = 2.5129 * np.sqrt(alpha)
    xubar = (1 + tauubar) * (1 + alpha / tauubar)
    eh_ub = int(min(np.ceil(rows / (1 + alpha)) - 1, rows)) - 1
    eh_ub = min(max(eh_ub, 0), rows - 2)
    upper = float(np.sum(s ** 2)) / (rows * cols)
    lower = max(float(s[eh_ub + 1] ** 2) / (cols * xubar), float(np.mean(s[eh_ub + 1:] ** 2)) / cols)
    if not lower < upper:
        lower = upper * 1e-6
    sigma2 = minimize_scalar(_free_energy, args=((rows, cols), s, 0.0, xubar), bounds=(lower, upper),
                             method="bounded").x
    threshold = np.sqrt(cols * sigma2 * (1 + tauubar) * (1 + alpha / tauubar))
    return max(1, int(np.sum(s > threshold)))


def smallest_rank(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The smallest rank in ``[low, high]`` for which ``fits(rank)`` holds (assumed monotone), or None."""
    if high < low or not fits(high):
        return None
    while low < high:
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid + 1
    return high


def cp_energy(kernel: np.ndarray, factors: Any) -> float:
    """The share of ``kernel``'s squared norm that a CP tensor ``factors`` reproduces."""
    import tensorly as tl

    approx = tl.cp_to_tensor(factors)
    total = float(np.sum(kernel ** 2))
    return 1.0 - float(np.sum((kernel - approx) ** 2)) / total if total else 1.0
