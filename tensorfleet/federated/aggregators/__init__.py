"""Aggregators of model updates, in one registry: :data:`AGGREGATORS`.

Every entry is an :class:`~tensorfleet.federated.aggregators.parts.Aggregator`: its options with
their defaults, its compiled form (an :class:`~tensorfleet.federated.aggregators.parts.AggregatorPart`
the compiled backend's round calls: :func:`build_part`) and, where TFF has one, its TFF form (a
``tff.aggregators`` factory for the ``tff`` backend: :func:`build_aggregator`). An aggregator of
one's own is one more entry (docs/how-to-add-an-aggregator-or-algorithm.md):

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
    tensorfleet.validation.UnknownOptionError: Aggregator 'median' takes no option 'beta' (its options: none). Received:
    beta=0.1

On the tff track, a factory:
    >>> import tensorflow_federated as tff
    >>> factory = build_aggregator("dp_fixed", clients_per_round=10, noise_multiplier=1.0, clip=0.5)
    >>> isinstance(factory, tff.aggregators.DifferentiallyPrivateFactory)
    True
"""

from __future__ import annotations

import importlib.util
from typing import Any

from tensorfleet.federated.aggregators.builtin import builtin_entries
from tensorfleet.federated.aggregators.parts import Aggregator, AggregatorPart, too_few_clients
from tensorfleet.registry import Registry

__all__ = ["AGGREGATORS", "Aggregator", "AggregatorPart", "aggregator_options", "build_aggregator", "build_part",
           "catalogue", "check_aggregator_options", "parse_options"]

AGGREGATORS: Registry[Aggregator] = Registry("aggregator")

for _name, _entry, _aliases, _description in builtin_entries():
    AGGREGATORS.register(_name, _entry, aliases=_aliases, description=_description)


def aggregator_options(name: str) -> list[str]:
    """The option names aggregator ``name`` accepts."""
    return AGGREGATORS.get(name).options()


def check_aggregator_options(name: str, options: dict[str, Any], *, clients_per_round: int | None = None) -> None:
    """TypeError naming the first of ``options`` that aggregator ``name`` (canonical) does not take;
    with ``clients_per_round``, also the values: ValueError when they are fewer than the aggregator
    needs (``Aggregator.min_clients``: ``krum``'s bound on ``num_byzantine``, a secure aggregator's 2),
    or when its compiled form refuses an option's value."""
    entry = AGGREGATORS.get(name)
    entry.given(name, options)
    if clients_per_round is not None:
        fewest, rule = entry.fewest_clients(options)
        if clients_per_round < fewest:
            raise too_few_clients(name, fewest, rule, "clients_per_round", clients_per_round)
    if clients_per_round is not None and entry.compiled is not None:
        entry.part(clients_per_round=clients_per_round, seed=0, options=options, name=name)


def build_part(name: str, *, clients_per_round: int, seed: int, options: dict[str, Any]) -> AggregatorPart:
    """The compiled form of aggregator ``name`` with ``options`` (what the compiled backend's round calls)."""
    canonical = AGGREGATORS.canonical(name)
    return AGGREGATORS.get(canonical).part(clients_per_round=clients_per_round, seed=seed, options=options,
                                           name=canonical)


def build_aggregator(name: str, *, clients_per_round: int, **options: Any) -> Any:
    """The TFF aggregation factory ``name`` with ``options`` (for the ``tff`` backend: it needs
    tensorflow-federated); unknown options raise TypeError before TFF is imported."""
    canonical = AGGREGATORS.canonical(name)
    entry = AGGREGATORS.get(canonical)
    given = entry.given(canonical, options)
    if entry.tff is None:
        raise ValueError(f"Aggregator {canonical!r} runs on the compiled backend only (it has no TFF form). "
                         f"Received: aggregator={name!r} on backend='tff'; use backend='compiled' or 'auto'.")
    check_aggregator_options(canonical, options, clients_per_round=clients_per_round)  # as the compiled backend
    return entry.tff(clients_per_round=clients_per_round, **given)


def catalogue() -> list[dict[str, Any]]:
    """One row per aggregator: name, aliases, options with defaults, backends, description, paper."""
    return [{"name": e.name, "aliases": list(e.aliases), "options": dict(e.obj.defaults),
             "backends": [b for b, f in (("compiled", e.obj.compiled), ("tff", e.obj.tff)) if f is not None],
             "description": e.description, "paper": e.obj.paper} for e in AGGREGATORS.entries()]


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


# Aggregators of packages that register themselves (the secure ones), when the package is there.
if importlib.util.find_spec("tensorfleet.federated.secure") is not None:
    importlib.import_module("tensorfleet.federated.secure")
