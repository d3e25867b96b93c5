"""Shamir's t-of-n secret sharing (Shamir, "How to share a secret", CACM 1979) of 32-byte secrets.

A secret is split into sixteen 16-bit words, each shared in the prime field of ``P = 2 ** 21 - 9``
with one random polynomial of degree ``t - 1``; holder ``i`` gets the polynomial's values at
``x = i``. Any ``t`` shares give the secret back by Lagrange interpolation at 0; ``t - 1`` shares
say nothing about it. The field is small so that evaluation is one float64 matrix product that is
exact (every partial sum stays below ``2 ** 53`` for up to 2,048 coefficients).

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> secret = bytes(range(32))
    >>> shares = split([secret], [1, 2, 3, 4, 5], threshold=3, rng=rng)
    >>> shares.shape
    (1, 5, 16)
    >>> reconstruct([2, 4, 5], shares[0, [1, 3, 4]]) == secret
    True
"""

from __future__ import annotations

import functools
import os
from typing import Any, Sequence

import numpy as np

__all__ = ["P", "SECRET_BYTES", "WORDS", "reconstruct", "split"]

P = 2 ** 21 - 9
SECRET_BYTES = 32
WORDS = SECRET_BYTES // 2
_MAX_THRESHOLD = 2048


@functools.lru_cache(maxsize=64)
def _powers(xs: tuple[int, ...], threshold: int) -> np.ndarray:
    """``[len(xs), threshold]``: ``x ** k mod P`` (float64, exact)."""
    out = np.ones((len(xs), threshold), np.int64)
    x = np.asarray(xs, np.int64) % P
    for k in range(1, threshold):
        out[:, k] = out[:, k - 1] * x % P
    return out.astype(np.float64)


def split(secrets: Sequence[bytes], xs: Sequence[int], *, threshold: int,
          rng: np.random.Generator | None = None) -> np.ndarray:
    """Shares of each of ``secrets`` for the holders at ``xs`` (distinct, 1 to ``P - 1``):
    ``[len(secrets), len(xs), WORDS]`` int64 field elements; any ``threshold`` rebuild a secret.
    The polynomials' coefficients come from ``rng`` (for reproducible examples) or else from the
    operating system's CSPRNG."""
    if not 1 <= threshold <= min(len(xs), _MAX_THRESHOLD):
        raise ValueError(f"threshold must be from 1 to the number of holders ({len(xs)}, at most "
                         f"{_MAX_THRESHOLD}). Received: threshold={threshold}")
    words = np.stack([np.frombuffer(_checked(s), "<u2") for s in secrets]).astype(np.float64)  # [S, WORDS]
    shape = (threshold, len(secrets) * WORDS)
    coefficients: np.ndarray
    if rng is None:  # 64 random bits mod P: a bias below 2 ** -42
        coefficients = (np.frombuffer(os.urandom(8 * shape[0] * shape[1]), np.uint64) % P).reshape(shape)
    else:
        coefficients = rng.integers(0, P, size=shape)
    coefficients = coefficients.astype(np.float64)
    coefficients[0] = words.ravel()
    values = np.fmod(_powers(tuple(int(x) for x in xs), threshold) @ coefficients, P)  # [H, S * WORDS]
    return values.astype(np.int64).reshape(len(xs), len(secrets), WORDS).transpose(1, 0, 2)


def _checked(secret: bytes) -> bytes:
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise ValueError(f"A shared secret must be {SECRET_BYTES} bytes. Received: {secret!r:.60}")
    return secret


@functools.lru_cache(maxsize=256)
def _lagrange_at_zero(xs: tuple[int, ...]) -> np.ndarray:
    weights = []
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % P
                den = den * (xm - xj) % P
        weights.append(num * pow(den, P - 2, P) % P)
    return np.asarray(weights, np.float64)


def reconstruct(xs: Sequence[int], shares: Any) -> bytes:
    """The secret whose shares at ``xs`` are ``shares`` (``[len(xs), WORDS]``). With fewer shares
    than the threshold the result is unrelated to the secret (and may not be 16-bit words)."""
    values = np.asarray(shares, np.float64)
    if len(set(xs)) != len(xs) or values.shape != (len(xs), WORDS):
        raise ValueError(f"Need one share of {WORDS} words per distinct holder. Received: holders {list(xs)[:8]}, "
                         f"shares of shape {values.shape}")
    words = np.fmod(_lagrange_at_zero(tuple(int(x) for x in xs)) @ values, P).astype(np.int64)
    return (words & 0xFFFF).astype("<u2").tobytes()
