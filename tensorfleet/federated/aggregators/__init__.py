"""Aggregators of model updates, in one registry: :data:`AGGREGATORS`.

Every entry builds, for the ``tff`` backend, a ``tff.aggregators`` factory from keyword options and
the number of clients per round (the compiled backend runs the same rules itself and checks the
options here, :func:`check_aggregator_options`, without TFF):

=================  ==========================================================================
``mean``           TFF's weighted mean (FedAvg's default)
``dp_fixed``       DP with fixed clipping (``noise_multiplier``, ``clip``)
``dp_adaptive``    DP with adaptive clipping (``noise_multiplier``, ``clip``, ``target_quantile``)
``compression``    sparsified and quantized updates (``bits``, ``sparsity``)
``median``         coordinate-wise median
``trimmed_mean``   coordinate-wise trimmed mean (``beta``)
``krum``           (Multi-)Krum (``num_byzantine``, ``num_selected``)
=================  ==========================================================================

TFF is imported only when a factory is built.

Example:
    >>> aggregator_options("trimmed_mean")
    ['beta']
    >>> check_aggregator_options("median", {"beta": 0.1})
    Traceback (most recent call last):
    TypeError: Aggregator 'median' takes no option 'beta' (its options: none). Received: beta=0.1

On the tff track, a factory:
    >>> import tensorflow_federated as tff
    >>> factory = build_aggregator("dp_fixed", clients_per_round=10, noise_multiplier=1.0, clip=0.5)
    >>> isinstance(factory, tff.aggregators.DifferentiallyPrivateFactory)
    True
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from tensorfleet.registry import Registry
from tensorfleet.validation import integer

__all__ = ["AGGREGATORS", "aggregator_options", "build_aggregator", "check_aggregator_options", "parse_options"]

AGGREGATORS: Registry[Callable[..., Any]] = Registry("aggregator")


def _mean(*, clients_per_round: int) -> Any:
    from tensorfleet.compat.tff import import_tff

    tff = import_tff("the mean aggregator's TFF factory")

    del clients_per_round
    return tff.aggregators.MeanFactory()


def _dp_fixed(*, clients_per_round: int, noise_multiplier: float = 1.0, clip: float = 1.0) -> Any:
    from tensorfleet.federated.aggregators.dp import dp_fixed

    return dp_fixed(noise_multiplier=noise_multiplier, clients_per_round=clients_per_round, clip=clip)


def _dp_adaptive(*, clients_per_round: int, noise_multiplier: float = 1.0, clip: float = 0.1,
                 target_quantile: float = 0.5, clip_learning_rate: float = 0.2) -> Any:
    from tensorfleet.federated.aggregators.dp import dp_adaptive

    return dp_adaptive(noise_multiplier=noise_multiplier, clients_per_round=clients_per_round, clip=clip,
                       target_quantile=target_quantile, clip_learning_rate=clip_learning_rate)


def _compression(*, clients_per_round: int, bits: int = 8, sparsity: float = 0.0) -> Any:
    from tensorfleet.federated.aggregators.compression import compression_factory

    del clients_per_round
    return compression_factory(bits=bits, sparsity=sparsity)


def _median(*, clients_per_round: int) -> Any:
    from tensorfleet.federated.aggregators.robust import RobustFactory

    del clients_per_round
    return RobustFactory("median")


def _trimmed_mean(*, clients_per_round: int, beta: float = 0.1) -> Any:
    from tensorfleet.federated.aggregators.robust import RobustFactory

    del clients_per_round
    return RobustFactory("trimmed_mean", beta=beta)


_KRUM_BYZANTINE = 1


def _krum(*, clients_per_round: int, num_byzantine: int = _KRUM_BYZANTINE, num_selected: int = 1) -> Any:
    from tensorfleet.federated.aggregators.robust import RobustFactory

    check_aggregator_options("krum", {"num_byzantine": num_byzantine}, clients_per_round=clients_per_round)
    return RobustFactory("krum", num_byzantine=num_byzantine, num_selected=num_selected)


AGGREGATORS.register("mean", _mean, description="Weighted mean (TFF MeanFactory), FedAvg's default.")
AGGREGATORS.register("dp_fixed", _dp_fixed, aliases=("dp",),
                     description="DP-FedAvg: fixed L2 clipping and Gaussian noise (McMahan et al. 2018).")
AGGREGATORS.register("dp_adaptive", _dp_adaptive,
                     description="DP with adaptive clipping to a norm quantile (Andrew et al. 2021).")
AGGREGATORS.register("compression", _compression, aliases=("compress",),
                     description="Top-k sparsified, uniformly quantized updates (bits, sparsity).")
AGGREGATORS.register("median", _median, aliases=("coordinate_median",),
                     description="Coordinate-wise median (Yin et al. 2018).")
AGGREGATORS.register("trimmed_mean", _trimmed_mean,
                     description="Coordinate-wise trimmed mean, beta trimmed per side (Yin et al. 2018).")
AGGREGATORS.register("krum", _krum, aliases=("multi_krum",),
                     description="(Multi-)Krum (Blanchard et al. 2017).")


def aggregator_options(name: str) -> list[str]:
    """The option names aggregator ``name`` accepts."""
    params = inspect.signature(AGGREGATORS.get(name)).parameters
    return [p for p in params if p != "clients_per_round"]


def check_aggregator_options(name: str, options: dict[str, Any], *, clients_per_round: int | None = None) -> None:
    """TypeError naming the first of ``options`` that aggregator ``name`` (canonical) does not take;
    ValueError when ``krum``'s ``num_byzantine`` needs more than ``clients_per_round`` (when given)."""
    allowed = aggregator_options(name)
    for key in options:
        if key not in allowed:
            raise TypeError(f"Aggregator {name!r} takes no option {key!r} (its options: "
                            f"{', '.join(allowed) or 'none'}). Received: {key}={options[key]!r}")
    if name == "krum" and clients_per_round is not None:
        from tensorfleet.federated.aggregators.aggregate import check_krum_clients

        byzantine = integer("num_byzantine", options.get("num_byzantine", _KRUM_BYZANTINE), minimum=0)
        check_krum_clients(clients_per_round, byzantine, name="clients_per_round")


def build_aggregator(name: str, *, clients_per_round: int, **options: Any) -> Any:
    """The TFF aggregation factory ``name`` with ``options`` (for the ``tff`` backend: it needs
    tensorflow-federated); unknown options raise TypeError before TFF is imported."""
    canonical = AGGREGATORS.canonical(name)
    check_aggregator_options(canonical, options)
    return AGGREGATORS.get(canonical)(clients_per_round=clients_per_round, **options)


def parse_options(text: str) -> dict[str, Any]:
    """``"noise_multiplier=1.0,clip=0.5"`` -> ``{"noise_multiplier": 1.0, "clip": 0.5}`` (ints, floats, strings)."""
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"Options must look like 'key=value,key=value'. Received: {text!r}")
        value: Any = raw.strip()
        for kind in (int, float):
            try:
                value = kind(value)
                break
            except ValueError:
                continue
        out[key.strip()] = value
    return out
