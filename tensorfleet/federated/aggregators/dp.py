"""Differential privacy for model updates, and the privacy it spends.

DP-FedAvg: McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private Recurrent Language
Models", ICLR 2018 (per-client L2 clipping, Gaussian noise on the sum). Adaptive clipping:
Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with Adaptive Clipping",
NeurIPS 2021. Both are TFF's ``tff.aggregators.DifferentiallyPrivateFactory``; tensorfleet
adds the accounting: :func:`epsilon` composes ``rounds`` Poisson-subsampled Gaussian mechanisms
with dp-accounting's RDP accountant (Mironov 2017) and converts to ``(epsilon, delta)``.

Example:
    >>> round(epsilon(noise_multiplier=1.0, sampling_rate=0.1, rounds=50, delta=1e-5), 2) > 0
    True
"""

from __future__ import annotations

import math
from typing import Any

from tensorfleet.validation import integer, number

__all__ = ["dp_fixed", "dp_adaptive", "epsilon"]


def dp_fixed(*, noise_multiplier: float, clients_per_round: int, clip: float = 1.0) -> Any:
    """Fixed L2 clipping at ``clip`` with Gaussian noise of stddev ``noise_multiplier * clip``."""
    import tensorflow_federated as tff

    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=number("noise_multiplier", noise_multiplier, minimum=0),
        clients_per_round=float(clients_per_round), clip=number("clip", clip, above=0))


def dp_adaptive(*, noise_multiplier: float, clients_per_round: int, clip: float = 0.1,
                target_quantile: float = 0.5, clip_learning_rate: float = 0.2) -> Any:
    """Adaptive clipping tracking the ``target_quantile`` of update norms, starting at ``clip``."""
    import tensorflow_federated as tff

    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
        noise_multiplier=number("noise_multiplier", noise_multiplier, minimum=0),
        clients_per_round=float(clients_per_round), initial_l2_norm_clip=number("clip", clip, above=0),
        target_unclipped_quantile=number("target_quantile", target_quantile, above=0, below=1),
        learning_rate=number("clip_learning_rate", clip_learning_rate, above=0))


def epsilon(*, noise_multiplier: float, sampling_rate: float, rounds: int, delta: float = 1e-5) -> float:
    """The epsilon spent after ``rounds`` rounds at client ``sampling_rate`` for the given ``delta``.

    Args:
        noise_multiplier: Gaussian noise stddev over the clip (user-level DP).
        sampling_rate: clients per round over total clients, in (0, 1].
        rounds: rounds run.
        delta: the delta of (epsilon, delta)-DP, in (0, 1).

    Returns:
        Epsilon; ``inf`` when ``noise_multiplier`` is 0.
    """
    number("sampling_rate", sampling_rate, above=0, maximum=1)
    number("delta", delta, above=0, below=1)
    integer("rounds", rounds, minimum=0)
    number("noise_multiplier", noise_multiplier, minimum=0)
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    import dp_accounting

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)), rounds)
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))
