"""The built-in aggregators as parts: the compiled form of each (:class:`MeanPart`, :class:`DPPart`,
:class:`CompressionPart`, :class:`RobustPart`) beside its TFF form, and their entries
(:func:`builtin_entries`, which :data:`~tensorfleet.federated.aggregators.AGGREGATORS` registers).

The compiled forms run TFF's arithmetic: ``MeanFactory`` (weighted by examples), DP-FedAvg's
clipping, noise and adaptive clip (``DifferentiallyPrivateFactory``, Andrew et al. 2021), the
compressed weighted sum (:class:`~tensorfleet.federated.aggregators.compression.CompressionFactory`)
and the robust rules (:class:`~tensorfleet.federated.aggregators.robust.RobustFactory`).

Example:
    >>> part = MeanPart()
    >>> part.rows, part.host
    (False, False)
    >>> DPPart(clip=0.5, noise_multiplier=1.0).initial_state()["clip"].tolist()
    0.5
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tensorfleet.federated.aggregators.parts import Aggregate, Aggregator, AggregatorPart, ClientUpdates, RoundContext
from tensorfleet.validation import integer, number, positive_int

__all__ = ["CompressionPart", "DPPart", "MeanPart", "RobustPart", "builtin_entries"]


class MeanPart(AggregatorPart):
    """The mean of the updates weighted by examples (TFF's ``MeanFactory``)."""

    def aggregate(self, state: dict[str, Any], updates: ClientUpdates, ctx: RoundContext) -> Aggregate:
        import tensorflow as tf

        return Aggregate(updates.values / tf.maximum(updates.weights, 1e-30), state, {})


class DPPart(AggregatorPart):
    """DP-FedAvg: every update clipped to L2 norm ``clip`` (all its tensors together), summed,
    Gaussian noise of ``noise_multiplier * clip`` added, over ``clients_per_round`` (unweighted);
    with ``adaptive = (target_quantile, learning_rate)`` the clip follows the noised fraction of
    unclipped updates (TFF's ``gaussian_adaptive``, whose noise split it takes)."""

    aux_size = 1

    def __init__(self, *, clip: float, noise_multiplier: float, clients_per_round: int = 1, seed: int = 0,
                 adaptive: tuple[float, float] | None = None) -> None:
        self.clip = float(number("clip", clip, above=0))
        noise = float(number("noise_multiplier", noise_multiplier, minimum=0))
        self.clients_per_round, self.seed, self.adaptive = int(clients_per_round), int(seed), adaptive
        self.count_stddev = 0.0
        self.value_noise = noise
        if adaptive is not None:
            number("target_quantile", adaptive[0], above=0, below=1)
            number("clip_learning_rate", adaptive[1], above=0)
            self.count_stddev = 0.05 * self.clients_per_round if noise > 0 else 0.0  # TFF's adaptive_clip_noise_params
            if noise > 0 and noise >= 2 * self.count_stddev:  # TFF's adaptive_clip_noise_params refuses it too
                raise ValueError("dp_adaptive's clipped-count noise (0.05 * clients_per_round = "
                                 f"{self.count_stddev:g}) is too low for noise_multiplier={noise:g}: it needs "
                                 f"noise_multiplier < 0.1 * clients_per_round. Received: noise_multiplier={noise:g}, "
                                 f"clients_per_round={self.clients_per_round}; raise clients_per_round or lower "
                                 "noise_multiplier.")
            self.value_noise = (noise ** -2 - (2 * self.count_stddev) ** -2) ** -0.5 if noise > 0 else 0.0

    def initial_state(self) -> dict[str, Any]:
        return {"clip": np.float32(self.clip)}  # a numpy scalar

    def client(self, update: Any, weight: Any, state: dict[str, Any], ctx: RoundContext) -> tuple[Any, Any]:
        import tensorflow as tf

        (clipped,), norm = tf.clip_by_global_norm([update], state["clip"])
        return clipped, tf.reshape(tf.cast(norm <= state["clip"], tf.float32) - 0.5, [1])  # TFF's unclipped count

    def aggregate(self, state: dict[str, Any], updates: ClientUpdates, ctx: RoundContext) -> Aggregate:
        from tensorfleet.federated.aggregators.dp import adapted_clip, dp_noised_mean

        clip = state["clip"]
        mean = dp_noised_mean(updates.values, ctx.sizes, clip * self.value_noise, ctx.clients_per_round, ctx.seed,
                              ctx.round_num)
        if self.adaptive is not None:
            clip = adapted_clip(clip, updates.aux[0], (*self.adaptive, self.count_stddev), ctx.clients_per_round,
                                ctx.seed, ctx.round_num)
        return Aggregate(mean, {"clip": clip}, {})


class CompressionPart(AggregatorPart):
    """Each client's ``examples * update`` sparsified and quantized per tensor (the rows of a tensor
    at once: :func:`~tensorfleet.federated.aggregators.compression.compress_rows`), summed, over the
    examples."""

    rows = True

    def __init__(self, *, bits: int = 8, sparsity: float = 0.0) -> None:
        self.bits = integer("bits", bits, minimum=1, maximum=32)
        self.sparsity = float(number("sparsity", sparsity, minimum=0, below=1))

    def aggregate(self, state: dict[str, Any], updates: ClientUpdates, ctx: RoundContext) -> Aggregate:
        import tensorflow as tf

        from tensorfleet.federated.aggregators.compression import compress_rows

        pieces = [compress_rows(t, bits=self.bits, sparsity=self.sparsity) for t in ctx.split(updates.values)]
        total = tf.reduce_sum(tf.concat(pieces, 1), 0)
        return Aggregate(total / tf.maximum(tf.reduce_sum(updates.weights), 1e-30), state, {})


class RobustPart(AggregatorPart):
    """An unweighted robust rule (median, trimmed mean, Krum) over the participants' updates
    (:class:`~tensorfleet.federated.aggregators.robust.RobustStatistic`; a non-finite update enters as zeros)."""

    rows = True

    def __init__(self, rule: str, **options: Any) -> None:
        self.rule, self.options = rule, options
        if "beta" in options:
            number("beta", options["beta"], minimum=0, below=0.5)
        if "num_byzantine" in options:
            integer("num_byzantine", options["num_byzantine"], minimum=0)
            positive_int("num_selected", options["num_selected"])

    def client(self, update: Any, weight: Any, state: dict[str, Any], ctx: RoundContext) -> tuple[Any, Any]:
        return update, self.no_aux(update)

    def aggregate(self, state: dict[str, Any], updates: ClientUpdates, ctx: RoundContext) -> Aggregate:
        from tensorfleet.federated.aggregators.robust import RobustStatistic

        return Aggregate(RobustStatistic(self.rule, **self.options).statistic(updates.values[:updates.participants]),
                         state, {})


# ----------------------------------------------------------------- the entries' factories

def _mean_tff(*, clients_per_round: int) -> Any:
    from tensorfleet.compat.tff import import_tff

    return import_tff("the mean aggregator's TFF factory").aggregators.MeanFactory()


def _dp_fixed_tff(*, clients_per_round: int, noise_multiplier: float, clip: float) -> Any:
    from tensorfleet.federated.aggregators.dp import dp_fixed

    return dp_fixed(noise_multiplier=noise_multiplier, clients_per_round=clients_per_round, clip=clip)


def _dp_adaptive_tff(*, clients_per_round: int, noise_multiplier: float, clip: float, target_quantile: float,
                     clip_learning_rate: float) -> Any:
    from tensorfleet.federated.aggregators.dp import dp_adaptive

    return dp_adaptive(noise_multiplier=noise_multiplier, clients_per_round=clients_per_round, clip=clip,
                       target_quantile=target_quantile, clip_learning_rate=clip_learning_rate)


def _compression_tff(*, clients_per_round: int, bits: int, sparsity: float) -> Any:
    from tensorfleet.federated.aggregators.compression import compression_factory

    return compression_factory(bits=bits, sparsity=sparsity)


def _robust_tff(rule: str) -> Any:
    def build(*, clients_per_round: int, **options: Any) -> Any:
        from tensorfleet.federated.aggregators.robust import RobustFactory

        return RobustFactory(rule, **options)

    build.__name__ = f"_{rule}_tff"
    return build


def _robust_part(rule: str) -> Any:
    def build(*, clients_per_round: int, seed: int, **options: Any) -> RobustPart:
        return RobustPart(rule, **options)  # (the fewest clients: the entry's min_clients, checked by the caller)

    build.__name__ = f"_{rule}_part"
    return build


def _dp_fixed_part(*, clients_per_round: int, seed: int, noise_multiplier: float, clip: float) -> DPPart:
    return DPPart(clip=clip, noise_multiplier=noise_multiplier, clients_per_round=clients_per_round, seed=seed)


def _dp_adaptive_part(*, clients_per_round: int, seed: int, noise_multiplier: float, clip: float,
                      target_quantile: float, clip_learning_rate: float) -> DPPart:
    return DPPart(clip=clip, noise_multiplier=noise_multiplier, clients_per_round=clients_per_round, seed=seed,
                  adaptive=(float(target_quantile), float(clip_learning_rate)))


def _compression_bytes(sizes: list[int], options: dict[str, Any]) -> int:
    from tensorfleet.federated.aggregators.aggregate import compressed_bytes

    return compressed_bytes(sizes, bits=int(options["bits"]), sparsity=float(options["sparsity"]))


KRUM_BYZANTINE = 1


def _krum_fewest(options: dict[str, Any]) -> int:
    """Krum's bound n > 2f + 2 (Blanchard et al. 2017): at least ``2 * num_byzantine + 3`` clients."""
    return 2 * integer("num_byzantine", options["num_byzantine"], minimum=0) + 3


def builtin_entries() -> list[tuple[str, Aggregator, tuple[str, ...], str]]:
    """``(name, entry, aliases, description)`` of every built-in aggregator. Each needs one client a round
    (a trimmed mean trims ``floor(beta * n)`` per side, ``beta < 0.5``, so one is always left) but Krum,
    whose bound is ``n > 2f + 2``."""
    entries = [
        ("mean", Aggregator(compiled=lambda clients_per_round, seed: MeanPart(), tff=_mean_tff),
         (), "Weighted mean (TFF MeanFactory), FedAvg's default."),
        ("dp_fixed", Aggregator(compiled=_dp_fixed_part, tff=_dp_fixed_tff, dp=True,
                                defaults={"noise_multiplier": 1.0, "clip": 1.0}, paper="McMahan et al., ICLR 2018"),
         ("dp",), "DP-FedAvg: fixed L2 clipping and Gaussian noise (McMahan et al. 2018)."),
        ("dp_adaptive", Aggregator(compiled=_dp_adaptive_part, tff=_dp_adaptive_tff, dp=True,
                                   defaults={"noise_multiplier": 1.0, "clip": 0.1, "target_quantile": 0.5,
                                             "clip_learning_rate": 0.2}, paper="Andrew et al., NeurIPS 2021"),
         (), "DP with adaptive clipping to a norm quantile (Andrew et al. 2021)."),
        ("compression", Aggregator(compiled=lambda clients_per_round, seed, **o: CompressionPart(**o),
                                   tff=_compression_tff, defaults={"bits": 8, "sparsity": 0.0},
                                   upload_bytes=_compression_bytes, paper="Konečný et al., 2016"),
         ("compress",), "Top-k sparsified, uniformly quantized updates (bits, sparsity)."),
        ("median",
         Aggregator(compiled=_robust_part("median"), tff=_robust_tff("median"), paper="Yin et al., ICML 2018"),
         ("coordinate_median",), "Coordinate-wise median (Yin et al. 2018)."),
        ("trimmed_mean", Aggregator(compiled=_robust_part("trimmed_mean"), tff=_robust_tff("trimmed_mean"),
                                    defaults={"beta": 0.1}, paper="Yin et al., ICML 2018"),
         (), "Coordinate-wise trimmed mean, beta trimmed per side (Yin et al. 2018)."),
        ("krum", Aggregator(compiled=_robust_part("krum"), tff=_robust_tff("krum"),
                            defaults={"num_byzantine": KRUM_BYZANTINE, "num_selected": 1},
                            paper="Blanchard et al., NeurIPS 2017", min_clients=_krum_fewest,
                            min_clients_rule="n > 2 * num_byzantine + 2, Blanchard et al. 2017; "
                                             "num_byzantine={num_byzantine}"),
         ("multi_krum",), "(Multi-)Krum (Blanchard et al. 2017)."),
    ]
    return [(name, entry if entry.min_clients is not None else dataclasses.replace(entry, min_clients=1), aliases, text)
            for name, entry, aliases, text in entries]
