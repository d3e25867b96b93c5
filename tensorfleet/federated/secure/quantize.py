"""Clipping and quantization of client updates to integers mod ``2 ** bits``.

Each value is clipped to ``[-clip, clip]`` (values that were outside are counted: saturation), then
mapped to ``levels + 1`` integers ``0..levels`` by unbiased stochastic rounding. ``levels`` is chosen
so that the sum over every client of a round cannot wrap around ``2 ** bits``:
``levels = (2 ** bits - 1) // clients``. The sum of ``m`` clients' integers, dequantized, is the mean
of their clipped values to within one quantization step, ``2 * clip / levels``.

Example:
    >>> import numpy as np
    >>> q = Quantizer(clip=1.0, bits=16, clients=3)
    >>> q.levels, q.dtype
    (21845, <class 'numpy.uint32'>)
    >>> ints, saturated = q.quantize(np.array([-5.0, 0.0, 1.0], np.float32), np.random.default_rng(0))
    >>> ints.tolist(), saturated
    ([0, 10923, 21845], 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorfleet.validation import integer, number

__all__ = ["MAX_BITS", "Quantizer", "modulus_dtype"]

MAX_BITS = 62  # sums of uint64 masks wrap at 2 ** 64; 62 leaves headroom for the extra counters


def modulus_dtype(bits: int) -> type:
    """The unsigned integer type whose wrap-around holds arithmetic mod ``2 ** bits`` (``2 ** bits``
    divides its own modulus, so reducing at the end gives the same result)."""
    return np.uint32 if bits <= 32 else np.uint64


@dataclass(frozen=True)
class Quantizer:
    """Clip to ``[-clip, clip]``, quantize to ``0..levels``, sum mod ``2 ** bits`` without wrapping.

    Args:
        clip: the largest magnitude a value keeps (larger ones saturate, and are counted).
        bits: the modulus is ``2 ** bits`` (what each masked value costs on the wire).
        clients: how many clients' integers may be summed (the round's sampled clients).
        headroom: room left on either side of the clients' sum (distributed DP's noise).
    """

    clip: float
    bits: int
    clients: int
    headroom: int = 0

    def __post_init__(self) -> None:
        number("clip", self.clip, above=0)
        integer("bits", self.bits, minimum=2, maximum=MAX_BITS)
        integer("clients", self.clients, minimum=1)
        integer("headroom", self.headroom, minimum=0)
        if self.levels < 1:
            raise ValueError(f"bits={self.bits} leave no quantization levels for {self.clients} clients (the sum of "
                             f"every client's values must stay below 2 ** bits): use bits >= "
                             f"{int(self.clients).bit_length()}. Received: bits={self.bits}")

    @property
    def levels(self) -> int:
        return (2 ** self.bits - 1 - 2 * self.headroom) // self.clients

    @property
    def dtype(self) -> type:
        return modulus_dtype(self.bits)

    @property
    def step(self) -> float:
        """The width of one quantization step: the bound of the dequantized mean's error."""
        return 2.0 * self.clip / self.levels

    def quantize(self, values: Any, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """``values`` (floats) as integers ``0..levels`` of :attr:`dtype`, and how many were clipped."""
        x = np.asarray(values, np.float64).ravel()
        saturated = int(np.count_nonzero(np.abs(x) > self.clip))
        scaled = (np.clip(x, -self.clip, self.clip) + self.clip) * (self.levels / (2.0 * self.clip))
        low = np.floor(scaled)
        ints = low + (rng.random(x.shape) < (scaled - low))
        return np.minimum(ints, self.levels).astype(self.dtype), saturated

    def dequantize_mean(self, total: Any, count: int) -> np.ndarray:
        """The mean of ``count`` clients' values from the sum of their integers (float32)."""
        integer("count", count, minimum=1)
        mean = np.asarray(total, np.float64) / count
        return (mean * (2.0 * self.clip / self.levels) - self.clip).astype(np.float32)

    def reduce(self, total: Any) -> np.ndarray:
        """``total`` mod ``2 ** bits``."""
        return np.asarray(total, self.dtype) & self.dtype(2 ** self.bits - 1)
