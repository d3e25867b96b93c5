"""The math of aggregation as small pure numpy functions.

Every aggregator in :mod:`tensorfleet.federated.aggregators` computes one of these inside TFF
(as TensorFlow ops that run in TFF's C++ worker); the tests check the TFF factories against these
functions, and these functions against their definitions, with numpy alone.

``updates`` is always a ``(num_clients, d)`` array: one flattened model update per row. A row
that holds NaN or infinity is treated as Byzantine and dropped before a robust rule is applied
(:func:`finite_rows`).

Robust rules:

* coordinate-wise median and trimmed mean: Yin, Chen, Ramchandran and Bartlett, "Byzantine-Robust
  Distributed Learning: Towards Optimal Statistical Rates", ICML 2018.
* Krum and Multi-Krum: Blanchard, El Mhamdi, Guerraoui and Stainer, "Machine Learning with
  Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017. Client ``i`` scores
  ``sum of its n - f - 2 smallest squared distances to the others``; Krum returns the update with
  the lowest score, Multi-Krum the mean of the ``m`` lowest. Their guarantee needs
  ``n > 2f + 2`` updates (:func:`check_krum_clients`).

Compression (client side, before summation): uniform quantization to ``bits`` per value over
each tensor's ``[min, max]`` (the rule of TFF's ``EncodedSumFactory.quantize_above_threshold``),
and top-k sparsification keeping the ``1 - sparsity`` fraction of largest magnitudes.

Example:
    >>> import numpy as np
    >>> coordinate_median(np.array([[0.0, 1.0], [2.0, 3.0], [100.0, -50.0]]))
    array([2., 1.])
"""

from __future__ import annotations

import math

import numpy as np

from tensorfleet.validation import integer, number, positive_int

__all__ = [
    "finite_rows", "coordinate_median", "trimmed_mean", "check_krum_clients", "krum_scores", "krum", "weighted_mean",
    "quantize", "sparsify", "kept_count", "compressed_bytes", "clip_by_l2_norm",
]


def _as_updates(updates: np.ndarray) -> np.ndarray:
    u = np.asarray(updates, dtype=np.float64)
    if u.ndim != 2:
        raise ValueError(f"updates must be a (num_clients, d) array. Received: updates.shape={u.shape}")
    return u


def finite_rows(updates: np.ndarray) -> np.ndarray:
    """The rows of ``updates`` whose values are all finite."""
    u = _as_updates(updates)
    return u[np.all(np.isfinite(u), axis=1)]


def weighted_mean(updates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """FedAvg's rule: ``sum_i w_i u_i / sum_i w_i`` (no row dropped)."""
    u = _as_updates(updates)
    w = np.asarray(weights, dtype=np.float64)
    return (w[:, None] * u).sum(axis=0) / w.sum()


def coordinate_median(updates: np.ndarray) -> np.ndarray:
    """Median of every coordinate over the finite rows; zeros when no row is finite."""
    u = finite_rows(updates)
    if len(u) == 0:
        return np.zeros(np.shape(updates)[1])
    return np.median(u, axis=0)


def trimmed_mean(updates: np.ndarray, beta: float = 0.1) -> np.ndarray:
    """Per coordinate, the mean after dropping the ``floor(beta * n)`` lowest and highest values.

    With nothing left after trimming the result is the median; zeros when no row is finite.
    """
    number("beta", beta, minimum=0, below=0.5)
    u = finite_rows(updates)
    n = len(u)
    if n == 0:
        return np.zeros(np.shape(updates)[1])
    k = int(math.floor(beta * n))
    if n - 2 * k <= 0:
        return np.median(u, axis=0)
    s = np.sort(u, axis=0)
    return s[k:n - k].mean(axis=0)


def check_krum_clients(num_clients: int, num_byzantine: int, *, name: str = "clients") -> None:
    """ValueError unless ``num_clients > 2 * num_byzantine + 2``, the bound of Krum's guarantee.

    ``name`` is what ``num_clients`` is called where it was given (``clients_per_round``, ...).

    Example:
        >>> check_krum_clients(4, 1, name="clients_per_round")
        Traceback (most recent call last):
        ValueError: Krum needs more than 2 * num_byzantine + 2 clients (n > 2f + 2, Blanchard et al. 2017): with
        num_byzantine=1, at least 5. Received: clients_per_round=4, num_byzantine=1
    """
    if num_clients <= 2 * num_byzantine + 2:
        raise ValueError(f"Krum needs more than 2 * num_byzantine + 2 clients (n > 2f + 2, Blanchard et al. 2017): "
                         f"with num_byzantine={num_byzantine}, at least {2 * num_byzantine + 3}. "
                         f"Received: {name}={num_clients}, num_byzantine={num_byzantine}")


def krum_scores(updates: np.ndarray, num_byzantine: int) -> np.ndarray:
    """Krum score of every (finite) row: sum of its ``max(n - f - 2, 1)`` smallest squared distances."""
    u = finite_rows(updates)
    n = len(u)
    sq = ((u[:, None, :] - u[None, :, :]) ** 2).sum(axis=-1)
    neighbours = max(n - num_byzantine - 2, 1)
    # Excluding the zero distance to itself: sort each row and skip its first entry.
    return np.sort(sq, axis=1)[:, 1:1 + neighbours].sum(axis=1) if n > 1 else np.zeros(n)


def krum(updates: np.ndarray, num_byzantine: int = 1, num_selected: int = 1) -> np.ndarray:
    """Multi-Krum: the mean of the ``num_selected`` rows with the lowest Krum scores (Krum when 1).

    Non-finite rows count among the ``n`` updates (they are Byzantine) and are then dropped.
    """
    integer("num_byzantine", num_byzantine, minimum=0)
    positive_int("num_selected", num_selected)
    check_krum_clients(len(_as_updates(updates)), num_byzantine, name="updates")
    u = finite_rows(updates)
    if len(u) == 0:
        return np.zeros(np.shape(updates)[1])
    scores = krum_scores(u, num_byzantine)
    chosen = np.argsort(scores, kind="stable")[: min(num_selected, len(u))]
    return u[chosen].mean(axis=0)


def clip_by_l2_norm(update: np.ndarray, clip: float) -> np.ndarray:
    """``update * min(1, clip / ||update||_2)``: the per-client clipping of DP-FedAvg."""
    norm = float(np.linalg.norm(update))
    return update * min(1.0, clip / norm) if norm > 0 else update


def quantize(values: np.ndarray, bits: int) -> np.ndarray:
    """Uniform quantization to ``2**bits`` levels over ``[min, max]``, returned dequantized."""
    integer("bits", bits, minimum=1, maximum=32)
    v = np.asarray(values, dtype=np.float64)
    lo, hi = float(v.min()), float(v.max())
    if hi == lo:
        return v.copy()
    levels = 2 ** bits - 1
    scale = (hi - lo) / levels
    return lo + np.round((v - lo) / scale) * scale


def kept_count(size: int, sparsity: float) -> int:
    """How many values top-k keeps of ``size`` at ``sparsity`` (at least one)."""
    number("sparsity", sparsity, minimum=0, below=1)
    return max(1, int(math.ceil(round(size * (1.0 - sparsity), 9))))  # round: 10 * (1 - 0.7) is 3.0000000000000004


def sparsify(values: np.ndarray, sparsity: float) -> np.ndarray:
    """Keeps the ``kept_count`` largest magnitudes (ties: lowest index first), zeroes the rest."""
    v = np.asarray(values, dtype=np.float64)
    flat = v.ravel()
    k = kept_count(flat.size, sparsity)
    keep = np.argsort(-np.abs(flat), kind="stable")[:k]
    out = np.zeros_like(flat)
    out[keep] = flat[keep]
    return out.reshape(v.shape)


def compressed_bytes(tensor_sizes: list[int], *, bits: int = 32, sparsity: float = 0.0) -> int:
    """Bytes one client uploads for tensors of ``tensor_sizes`` under this compression.

    Per tensor: ``ceil(k * bits / 8)`` for the ``k`` kept values, plus 4 bytes per kept index
    when sparsified, plus 8 bytes (float32 min and max) when quantized below 32 bits.
    """
    total = 0
    for size in tensor_sizes:
        k = kept_count(size, sparsity)
        total += math.ceil(k * bits / 8)
        if sparsity > 0:
            total += 4 * k
        if bits < 32:
            total += 8
    return total
