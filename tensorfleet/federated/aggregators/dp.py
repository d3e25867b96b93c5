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

__all__ = ["dp_fixed", "dp_adaptive", "epsilon"]


def _positive(name: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number. Received: {name}={value!r}")
    return float(value)


def dp_fixed(*, noise_multiplier: float, clients_per_round: int, clip: float = 1.0) -> Any:
    """Fixed L2 clipping at ``clip`` with Gaussian noise of stddev ``noise_multiplier * clip``."""
    import tensorflow_federated as tff

    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be non-negative. Received: noise_multiplier={noise_multiplier!r}")
    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=float(noise_multiplier), clients_per_round=float(clients_per_round),
        clip=_positive("clip", clip))


def dp_adaptive(*, noise_multiplier: float, clients_per_round: int, clip: float = 0.1,
                target_quantile: float = 0.5, clip_learning_rate: float = 0.2) -> Any:
    """Adaptive clipping tracking the ``target_quantile`` of update norms, starting at ``clip``."""
    import tensorflow_federated as tff

    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be non-negative. Received: noise_multiplier={noise_multiplier!r}")
    if not 0.0 < target_quantile < 1.0:
        raise ValueError(f"target_quantile must be in (0, 1). Received: target_quantile={target_quantile!r}")
    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
        noise_multiplier=float(noise_multiplier), clients_per_round=float(clients_per_round),
        initial_l2_norm_clip=_positive("clip", clip), target_unclipped_quantile=float(target_quantile),
        learning_rate=_positive("clip_learning_rate", clip_learning_rate))


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
    if not 0.0 < sampling_rate <= 1.0:
        raise ValueError(f"sampling_rate must be in (0, 1]. Received: sampling_rate={sampling_rate!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1). Received: delta={delta!r}")
    if not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be a non-negative integer. Received: rounds={rounds!r}")
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be non-negative. Received: noise_multiplier={noise_multiplier!r}")
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
