"""Offline datasets. No machine this package is tested on reaches a dataset hub, so the
defaults are scikit-learn's bundled digits and data the code generates."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tensorfleet.validation import number

__all__ = ["Split", "load_digits"]


class Split(NamedTuple):
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits(*, test_fraction: float = 0.2, seed: int = 0, flat: bool = False) -> Split:
    """scikit-learn's 1,797 8x8 digits, scaled to [0, 1], shuffled with ``seed``, split.

    Images come as float32 ``(n, 8, 8, 1)`` (or ``(n, 64)`` with ``flat=True``), labels int32.

    Example:
        >>> split = load_digits()
        >>> split.x_train.shape, split.x_test.shape
        ((1438, 8, 8, 1), (359, 8, 8, 1))
    """
    number("test_fraction", test_fraction, above=0, below=1)
    from sklearn.datasets import load_digits as _load

    bunch = _load()
    x = (bunch.images.astype(np.float32) / 16.0)
    y = bunch.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    x = x.reshape(len(x), 64) if flat else x[..., None]
    n_test = int(round(len(x) * test_fraction))
    return Split(x[n_test:], y[n_test:], x[:n_test], y[:n_test])
