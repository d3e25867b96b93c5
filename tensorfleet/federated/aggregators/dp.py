"""Differential privacy for model updates, and the privacy it spends.

DP-FedAvg: McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private Recurrent Language
Models", ICLR 2018 (per-client L2 clipping, Gaussian noise on the sum). Adaptive clipping:
Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with Adaptive Clipping",
NeurIPS 2021. On the ``tff`` backend both are TFF's ``tff.aggregators.DifferentiallyPrivateFactory``
(:func:`dp_fixed`, :func:`dp_adaptive`); the compiled backend runs the same clipping, noise and clip
updates itself (:class:`~tensorfleet.federated.aggregators.builtin.DPPart`, with :func:`dp_noised_mean`
and :func:`adapted_clip`). tensorfleet adds the
accounting, :func:`epsilon`, with dp-accounting's RDP accountant (Mironov 2017).

What is accounted is what the simulation does: each round samples exactly ``clients_per_round``
of ``num_clients`` clients uniformly without replacement. That sampling is analysed under
replace-one adjacency (one client's data swapped for another's; the number of clients is public):
Wang, Balle and Kasiviswanathan, "Subsampled Renyi Differential Privacy and Analytical Moments
Accountant", AISTATS 2019 (dp-accounting's ``SampledWithoutReplacementDpEvent``). Swapping one
client moves the clipped sum by up to ``2 * clip``, so the accountant is given half the noise
multiplier (noise stddev over that sensitivity). ``sampling="poisson"`` gives instead the figure
most papers and TFF's tutorials report, Poisson sampling at rate ``clients_per_round / num_clients``
under add-or-remove adjacency: an approximation for this simulation, and not comparable one to one
(replace-one is the stronger adjacency).

Example:
    >>> exact = epsilon(noise_multiplier=1.0, clients_per_round=10, num_clients=100, rounds=50, delta=1e-5)
    >>> poisson = epsilon(noise_multiplier=1.0, clients_per_round=10, num_clients=100, rounds=50, delta=1e-5,
    ...                   sampling="poisson")
    >>> round(exact, 1), round(poisson, 1)
    (47.0, 5.9)
"""

from __future__ import annotations

import functools
import math
from enum import Enum
from typing import Any

from tensorfleet.validation import choice, integer, number, positive_int

__all__ = ["DpSampling", "adapted_clip", "dp_adaptive", "dp_fixed", "dp_noised_mean", "epsilon"]


def dp_fixed(*, noise_multiplier: float, clients_per_round: int, clip: float = 1.0) -> Any:
    """TFF's factory of fixed L2 clipping at ``clip`` with Gaussian noise of stddev ``noise_multiplier * clip``
    (the ``tff`` backend's; the compiled backend runs the same rules itself)."""
    from tensorfleet.compat.tff import import_tff

    tff = import_tff("the dp_fixed aggregator's TFF factory")

    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=number("noise_multiplier", noise_multiplier, minimum=0),
        clients_per_round=float(clients_per_round), clip=number("clip", clip, above=0))


def dp_adaptive(*, noise_multiplier: float, clients_per_round: int, clip: float = 0.1,
                target_quantile: float = 0.5, clip_learning_rate: float = 0.2) -> Any:
    """TFF's factory of adaptive clipping tracking the ``target_quantile`` of update norms, starting at ``clip``
    (the ``tff`` backend's; the compiled backend runs the same rules itself)."""
    from tensorfleet.compat.tff import import_tff

    tff = import_tff("the dp_adaptive aggregator's TFF factory")

    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
        noise_multiplier=number("noise_multiplier", noise_multiplier, minimum=0),
        clients_per_round=float(clients_per_round), initial_l2_norm_clip=number("clip", clip, above=0),
        target_unclipped_quantile=number("target_quantile", target_quantile, above=0, below=1),
        learning_rate=number("clip_learning_rate", clip_learning_rate, above=0))


class DpSampling(str, Enum):
    """How the clients of a round are drawn, for :func:`epsilon`."""

    WITHOUT_REPLACEMENT = "without_replacement"  # what Simulation does
    POISSON = "poisson"


def epsilon(*, noise_multiplier: float, clients_per_round: int, num_clients: int, rounds: int, delta: float = 1e-5,
            sampling: str | DpSampling = DpSampling.WITHOUT_REPLACEMENT) -> float:
    """The epsilon spent after ``rounds`` rounds of ``clients_per_round`` of ``num_clients`` clients.

    Args:
        noise_multiplier: Gaussian noise stddev over the clip (user-level DP).
        clients_per_round: clients sampled per round.
        num_clients: clients sampled from.
        rounds: rounds run.
        delta: the delta of (epsilon, delta)-DP, in (0, 1).
        sampling: ``without_replacement`` (what the simulation does; replace-one adjacency) or
            ``poisson`` (the usual approximation; add-or-remove adjacency). See the module docstring.

    Returns:
        Epsilon; ``inf`` when ``noise_multiplier`` is 0.
    """
    how = choice(DpSampling, "sampling", sampling)
    population = positive_int("num_clients", num_clients)
    sampled = integer("clients_per_round", clients_per_round, minimum=1, maximum=population)
    number("delta", delta, above=0, below=1)
    integer("rounds", rounds, minimum=0)
    number("noise_multiplier", noise_multiplier, minimum=0)
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    import dp_accounting

    orders, one_round = _one_round_rdp(float(noise_multiplier), sampled, population, how)
    return float(dp_accounting.rdp.compute_epsilon(orders, rounds * one_round, delta)[0])


@functools.lru_cache(maxsize=32)
def _one_round_rdp(noise_multiplier: float, sampled: int, population: int, how: DpSampling) -> tuple[Any, Any]:
    """``(orders, RDP of one round)`` of dp-accounting's RDP accountant. Composing ``rounds`` rounds
    multiplies it by ``rounds`` (what ``SelfComposedDpEvent`` does), so the costly part (about a
    second for sampling without replacement) runs once per configuration, not every round."""
    import dp_accounting

    from tensorfleet.compat.dp import rdp_orders_and_values

    if how is DpSampling.POISSON:
        accountant = dp_accounting.rdp.RdpAccountant()
        event: Any = dp_accounting.PoissonSampledDpEvent(
            sampled / population, dp_accounting.GaussianDpEvent(noise_multiplier))
    else:
        accountant = dp_accounting.rdp.RdpAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        event = dp_accounting.SampledWithoutReplacementDpEvent(
            population, sampled, dp_accounting.GaussianDpEvent(noise_multiplier / 2))
    accountant.compose(event)
    return rdp_orders_and_values(accountant)  # no public reader of these (dp-accounting 0.4.3 to 0.6)


def dp_noised_mean(clipped_sum: Any, sizes: Any, stddev: Any, denominator: int, seed: int, round_num: Any) -> Any:
    """TFF's DP-FedAvg result from the flat clipped sum (``NormalizedQuery(GaussianSumQuery)``), in
    TensorFlow: every tensor's piece (``sizes``) plus Gaussian noise of ``stddev``, over
    ``denominator``. The noise is drawn statelessly from ``seed`` and ``round_num`` (a resumed run
    draws what the uninterrupted one did)."""
    import tensorflow as tf

    round_num = tf.cast(round_num, tf.int64)
    out = []
    pieces = tf.split(clipped_sum, list(sizes))
    for i, total in enumerate(pieces):
        key = tf.stack([tf.constant(seed, tf.int64), round_num * len(pieces) + i])
        noise = tf.random.stateless_normal(tf.shape(total), key, stddev=stddev, dtype=total.dtype)
        out.append((total + noise) / float(denominator))
    return tf.concat(out, 0)


def adapted_clip(clip: Any, unclipped_sum: Any, adaptive: tuple[float, float, float], denominator: int, seed: int,
                 round_num: Any) -> Any:
    """The next clip of TFF's adaptive clipping (tensorflow_privacy's ``QuantileEstimatorQuery``,
    geometric update), in TensorFlow: ``unclipped_sum`` is the sum over clients of ``[norm <= clip] - 0.5``."""
    import tensorflow as tf

    target, learning_rate, count_stddev = adaptive
    key = tf.stack([tf.constant(seed, tf.int64), -1 - tf.cast(round_num, tf.int64)])
    noised = (unclipped_sum + tf.random.stateless_normal([], key, stddev=count_stddev)) / float(denominator)
    below = tf.minimum(1.0, tf.maximum(0.0, noised + 0.5))
    return tf.maximum(clip * tf.math.exp(-(learning_rate * (below - target))), 0.0)
