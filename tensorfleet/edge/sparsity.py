"""Pruning schedules, magnitude masks and 1-D k-means: the NumPy math of the Keras 3 route's pruning and
clustering (:mod:`tensorfleet.edge.keras3_optimize`), checked on its own by the tests.

Example:
    >>> pruning_mask(np.array([3.0, -1.0, 0.5, 2.0]), 0.5).tolist()
    [1.0, 0.0, 0.0, 1.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorfleet.validation import integer, number

__all__ = ["ConstantSparsity", "PolynomialDecay", "kmeans_1d", "pruning_mask", "schedule_of"]


@dataclass(frozen=True)
class ConstantSparsity:
    """``sparsity`` from ``begin_step`` on, the mask recomputed every ``frequency`` steps (tfmot's ConstantSparsity)."""

    sparsity: float
    begin_step: int = 0
    frequency: int = 100

    def __call__(self, step: int) -> float | None:
        """The sparsity to prune to at ``step``, or None when the mask is not recomputed then."""
        if step < self.begin_step or (step - self.begin_step) % self.frequency:
            return None
        return self.sparsity


@dataclass(frozen=True)
class PolynomialDecay:
    """Sparsity rising from ``initial_sparsity`` at ``begin_step`` to ``final_sparsity`` at ``end_step`` as
    ``final + (initial - final) * (1 - p) ** power``, ``p`` the fraction of the way (Zhu & Gupta; tfmot's
    PolynomialDecay); the mask recomputed every ``frequency`` steps in ``[begin_step, end_step]``."""

    initial_sparsity: float
    final_sparsity: float
    begin_step: int
    end_step: int
    power: float = 3.0
    frequency: int = 100

    def __call__(self, step: int) -> float | None:
        """The sparsity to prune to at ``step``, or None when the mask is not recomputed then."""
        if not self.begin_step <= step <= self.end_step or (step - self.begin_step) % self.frequency:
            return None
        p = (step - self.begin_step) / max(self.end_step - self.begin_step, 1)
        return self.final_sparsity + (self.initial_sparsity - self.final_sparsity) * (1.0 - p) ** self.power


def schedule_of(*, sparsity: float = 0.5, schedule: str = "constant", begin_step: int = 0, frequency: int = 10,
                initial_sparsity: float = 0.0, end_step: int | None = None, power: float = 3.0) -> Any:
    """The schedule ``apply_pruning``'s options describe (the same options for tfmot's schedules)."""
    number("sparsity", sparsity, above=0, below=1)
    integer("begin_step", begin_step, minimum=0)
    integer("frequency", frequency, minimum=1)
    if schedule == "constant":
        for name, value, default in (("initial_sparsity", initial_sparsity, 0.0), ("end_step", end_step, None),
                                     ("power", power, 3.0)):
            if value != default:
                raise ValueError(f"{name} applies to schedule='polynomial' only. Received: {name}={value!r} "
                                 f"with schedule='constant'")
        return ConstantSparsity(float(sparsity), begin_step, frequency)
    if schedule != "polynomial":
        raise ValueError(f"schedule must be 'constant' or 'polynomial'. Received: schedule={schedule!r}")
    number("initial_sparsity", initial_sparsity, minimum=0, below=1)
    number("power", power, above=0)
    if end_step is None:
        raise ValueError("schedule='polynomial' needs end_step= (the step at which sparsity reaches its final "
                         "value). Received: end_step=None")
    integer("end_step", end_step, minimum=begin_step + 1)
    return PolynomialDecay(float(initial_sparsity), float(sparsity), begin_step, end_step, float(power), frequency)


def pruning_mask(kernel: np.ndarray, sparsity: float) -> np.ndarray:
    """A 0/1 mask keeping the ``round(n * (1 - sparsity))`` largest ``|kernel|`` entries (ties: the first in
    C order), as tfmot counts them; the others are zero."""
    flat = np.abs(np.asarray(kernel, np.float32)).ravel()
    keep = int(round(flat.size * (1.0 - float(sparsity))))
    mask = np.zeros(flat.size, np.float32)
    if keep:
        mask[np.argsort(-flat, kind="stable")[:keep]] = 1.0
    return mask.reshape(np.shape(kernel))


def kmeans_1d(values: np.ndarray, k: int, *, seed: int = 0, iterations: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """``k`` centroids of ``values`` (k-means++ start, then Lloyd's iterations; an emptied cluster restarts at the
    value farthest from its centroid) and each value's centroid index.

    Raises:
        ValueError: ``values`` holds fewer than ``k`` distinct values.
    """
    x = np.asarray(values, np.float64).ravel()
    if np.unique(x).size < k:
        raise ValueError(f"cannot make {k} clusters of {np.unique(x).size} distinct values")
    rng = np.random.default_rng(seed)
    centroids = [x[rng.integers(x.size)]]
    for _ in range(1, k):
        d2 = np.min((x[:, None] - np.asarray(centroids)[None]) ** 2, axis=1)
        centroids.append(x[rng.choice(x.size, p=d2 / d2.sum())])
    c = np.sort(np.asarray(centroids))
    for _ in range(iterations):
        index = np.argmin(np.abs(x[:, None] - c[None]), axis=1)
        new = c.copy()
        for j in range(k):
            members = x[index == j]
            if members.size:
                new[j] = members.mean()
            else:
                far = int(np.argmax(np.abs(x - c[index])))
                new[j] = x[far]
                index[far] = j
        if np.array_equal(new, c):
            break
        c = np.sort(new)
    index = np.argmin(np.abs(x[:, None] - c[None]), axis=1)
    return c.astype(np.float32), index.reshape(np.shape(values)).astype(np.int32)


# ---------------------------------------------------------------------------------------------------------------
# The layer's own operation on a given kernel
