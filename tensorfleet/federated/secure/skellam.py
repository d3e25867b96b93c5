"""Distributed DP under secure aggregation: the Skellam mechanism (Agarwal, Kairouz and Liu, "The
Skellam Mechanism for Differentially Private Federated Learning", NeurIPS 2021).

Each client L2-clips its update, quantizes it to integers and adds integer noise drawn from the
symmetric Skellam distribution ``Sk(mu / n) = Poisson(mu / 2n) - Poisson(mu / 2n)`` (variance
``mu / n``) to every value *before* masking. A sum of independent Skellam variables is Skellam, so
the sum the server unmasks carries ``Sk(m * mu / n)`` for ``m`` surviving clients, and the server
never sees a sum without it. Every quantity here is in integer units of the quantization grid.

Privacy (replace-one adjacency, the one :func:`tensorfleet.federated.aggregators.dp.epsilon` uses):
one client's centred integer vector has L2 norm at most :attr:`SkellamPlan.bound` (conditional
randomized rounding, Kairouz, Liu and Steinke, ICML 2021, section 4.1: the client redraws its
stochastic rounding until the bound holds, so it holds always), so swapping one client moves the sum by
``D2 = 2 * bound`` in L2 and ``D1 = min(sqrt(d) * D2, D2 ** 2)`` in L1 (an integer vector). For
integer orders ``a > 1`` the mechanism is ``(a, eps(a))``-RDP with (the paper's Theorem 3.5):

    eps(a) = a * D2**2 / (2 mu) + min(((2a - 1) * D2**2 + 6 * D1) / (4 mu**2), 3 * D1 / (2 mu))

Rounds compose by adding RDP; dp-accounting's ``compute_epsilon`` converts to ``(epsilon, delta)``.
Two conservative choices, so the figure is an upper bound: no amplification by sampling is
claimed (dp-accounting's subsampled accountants are for the Gaussian; sampling only lowers
epsilon), and the noise counted is that of the fewest survivors a round may release with,
:attr:`SkellamPlan.min_survivors` (dropouts remove their noise: fewer clients, less noise).

Wrap-around: the sum must stay in ``[0, 2 ** bits)`` to be read back. The plan leaves a
``margin`` on either side of the clients' values that the noise exceeds in any coordinate with
probability below ``2 ** -40`` (Bernstein's inequality for a difference of Poisson variables), and
fewer quantization levels per client accordingly; too few bits for that are refused with the bits
needed. The grid is also kept no finer than puts each client's Poisson rate at ``2 ** 32`` (numpy's
Poisson sampler loses accuracy far above; the noise is then about 10^5 grid steps, so a finer grid
would add nothing): many bits beyond what the noise needs are left unused.

Example:
    >>> plan = SkellamPlan.of(clip=1.0, dp_clip=1.0, noise_multiplier=1.0, bits=24, clients=10, size=1000,
    ...                       min_survivors=6)
    >>> plan.levels, plan.margin, 10 * plan.levels + 2 * plan.margin < 2 ** 24
    (586171, 5457752, True)
    >>> plan.epsilon(rounds=1, delta=1e-5) > plan.epsilon(rounds=1, delta=1e-5, survivors=10)  # 6 clients' noise
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorfleet.federated.secure.quantize import MAX_BITS
from tensorfleet.validation import integer, number

__all__ = ["ORDERS", "SkellamPlan", "skellam_noise", "skellam_rdp", "tail_margin"]

ORDERS = tuple(range(2, 257))  # the bound holds at integer orders
TAIL = 2.0 ** -40  # chance that any one coordinate's noise passes the margin
MIN_LEVELS = 2  # a client's grid holds at least -clip, 0 and clip
MAX_RATE = 2.0 ** 32  # the largest Poisson rate drawn: numpy's sampler drifts far above it (variance +4% at 1e15)
_LOG_INV_BETA = 0.5  # conditional rounding's beta = exp(-1/2): a draw is kept with probability >= 1 - beta


def tail_margin(mu: float, size: int) -> int:
    """The smallest ``t`` with ``2 * size * exp(-t**2 / (2 * (mu + t / 3))) <= 2 ** -40``: Skellam noise
    of variance ``mu`` passes ``t`` in magnitude in any of ``size`` coordinates with at most that chance."""
    c = math.log(2.0 * size / TAIL)
    return math.ceil(c / 3.0 + math.sqrt(c * c / 9.0 + 2.0 * c * mu))


def skellam_rdp(orders: np.ndarray, *, l1: float, l2: float, mu: float) -> np.ndarray:
    """The RDP of Skellam noise of variance ``mu`` at integer ``orders`` for sensitivities ``l1``, ``l2``."""
    a = np.asarray(orders, np.float64)
    return a * l2 ** 2 / (2 * mu) + np.minimum(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * mu ** 2), 3 * l1 / (2 * mu))


def skellam_noise(rng: np.random.Generator, mu: float, size: int) -> np.ndarray:
    """``size`` draws of ``Sk(mu) = Poisson(mu / 2) - Poisson(mu / 2)`` (int64, variance ``mu``)."""
    return rng.poisson(mu / 2.0, size).astype(np.int64) - rng.poisson(mu / 2.0, size).astype(np.int64)


@dataclass(frozen=True)
class SkellamPlan:
    """The integer grid and noise of one round of distributed DP (see the module).

    Attributes:
        clients: the clients sampled in the round (each adds variance ``mu / clients``).
        size: values per update.
        bits: sums are taken mod ``2 ** bits``.
        levels: quantization levels per client (fewer than without noise: the margin's room).
        margin: room left on either side of the clients' values for the noise of the sum.
        mu: the variance of the noise of all ``clients`` clients' sum (integer units).
        bound: the L2 norm bound of one client's centred integer vector.
        min_survivors: the fewest clients a round releases a sum of (epsilon is for their noise).
    """

    clients: int
    size: int
    bits: int
    levels: int
    margin: int
    mu: float
    bound: float
    min_survivors: int

    @classmethod
    def of(cls, *, clip: float, dp_clip: float, noise_multiplier: float, bits: int, clients: int, size: int,
           min_survivors: int) -> "SkellamPlan":
        """The plan for ``clients`` updates of ``size`` values clipped to L2 norm ``dp_clip`` (and to
        ``clip`` per value), noise of stddev ``noise_multiplier * dp_clip`` on the full sum (as
        central DP's), sums mod ``2 ** bits``; ValueError naming the bits needed when they are too few."""
        number("noise_multiplier", noise_multiplier, above=0)
        n, d = integer("clients", clients, minimum=1), integer("size", size, minimum=1)
        integer("min_survivors", min_survivors, minimum=1, maximum=n)
        plan = cls._fit(clip, dp_clip, noise_multiplier, bits, n, d, min_survivors)
        if plan is None:
            needed = next((b for b in range(bits + 1, MAX_BITS + 1)
                           if cls._fit(clip, dp_clip, noise_multiplier, b, n, d, min_survivors)), None)
            advice = f"use bits >= {needed}" if needed else f"no bits up to {MAX_BITS} do: lower noise_multiplier"
            size_text = f"{d:,} value" + ("s" if d > 1 else "")
            raise ValueError(f"bits={bits} leave no room for distributed DP's noise on updates of {size_text}: {n} "
                             f"clients' values of at least {MIN_LEVELS} levels each plus the noise's margin on either "
                             f"side (stddev noise_multiplier * dp_clip = {noise_multiplier * dp_clip:g}; it widens "
                             f"with the values) would wrap around 2 ** bits; {advice}. Received: bits={bits}")
        return plan

    @classmethod
    def _fit(cls, clip: float, dp_clip: float, noise_multiplier: float, bits: int, n: int, d: int,
             min_survivors: int) -> "SkellamPlan | None":
        def mu_of(levels: int) -> float:  # the float stddev in grid steps, squared
            return (noise_multiplier * dp_clip * levels / (2.0 * clip)) ** 2

        room = 2 ** bits - 1
        # no finer grid than keeps each client's Poisson rate mu / 2n within MAX_RATE (the noise is then
        # ~10^5 grid steps or more: a finer grid would change nothing but the sampler's accuracy)
        finest = math.floor(2.0 * clip * math.sqrt(2.0 * n * MAX_RATE) / (noise_multiplier * dp_clip))
        low, high = MIN_LEVELS - 1, min(room // n, finest)  # the most levels whose sum and margin fit
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if n * mid + 2 * tail_margin(mu_of(mid), d) <= room else (low, mid - 1)
        if low < MIN_LEVELS:
            return None
        margin = (room - n * low) // 2  # all the room left: at least the noise's margin
        levels = (room - 2 * margin) // n  # what Quantizer(headroom=margin) counts: low, or low + 1 when n = 1
        scale = levels / (2.0 * clip) * min(dp_clip, clip * math.sqrt(d))  # the largest norm in grid steps
        bound = math.sqrt(scale ** 2 + d / 4.0 + math.sqrt(2 * _LOG_INV_BETA) * (scale + math.sqrt(d) / 2.0))
        return cls(clients=n, size=d, bits=bits, levels=levels, margin=margin, mu=mu_of(levels),
                   bound=bound, min_survivors=min_survivors)

    @property
    def client_mu(self) -> float:
        """The variance of each client's noise."""
        return self.mu / self.clients

    @property
    def l2(self) -> float:
        return 2.0 * self.bound

    @property
    def l1(self) -> float:
        return min(math.sqrt(self.size) * self.l2, self.l2 ** 2)

    def rdp(self, survivors: int | None = None) -> np.ndarray:
        """One round's RDP at :data:`ORDERS` when ``survivors`` clients' noise is summed (default the fewest)."""
        m = self.min_survivors if survivors is None else integer("survivors", survivors, minimum=1,
                                                                 maximum=self.clients)
        return skellam_rdp(np.asarray(ORDERS), l1=self.l1, l2=self.l2, mu=self.client_mu * m)

    def epsilon(self, *, rounds: int, delta: float, survivors: int | None = None) -> float:
        """Epsilon after ``rounds`` rounds (no sampling amplification; see the module)."""
        import dp_accounting

        integer("rounds", rounds, minimum=0)
        number("delta", delta, above=0, below=1)
        if rounds == 0:
            return 0.0
        return float(dp_accounting.rdp.compute_epsilon(np.asarray(ORDERS, np.float64), rounds * self.rdp(survivors),
                                                       delta)[0])

    def decode(self, total: np.ndarray, survivors: int) -> np.ndarray:
        """The unmasked sum of ``survivors`` clients' noised values mod ``2 ** bits`` back to signed
        integers (int64): a value above what the clients' values plus the margin reach wrapped below 0."""
        values = np.asarray(total).astype(np.int64)
        modulus = np.int64(2) ** np.int64(self.bits)
        top = survivors * self.levels + self.margin
        return np.where(values > top, values - modulus, values)
