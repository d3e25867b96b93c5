"""FedSGD: federated stochastic gradient descent.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017 (the FedSGD baseline; also Shokri and Shmatikov 2015). Every client computes one
gradient over its whole local dataset; the server averages the gradients and takes one step with
the server optimizer. Built on ``tff.learning.algorithms.build_fed_sgd``.
"""

from __future__ import annotations

from typing import Any

from tensorfleet.federated.algorithms.base import is_unweighted

__all__ = ["build", "client_work"]


def build(model_fn: Any, *, client_optimizer: Any, server_optimizer: Any, aggregator: Any = None) -> Any:
    """FedSGD learning process (``client_optimizer`` is unused: clients take no local steps)."""
    from tensorfleet.compat.tff import import_tff

    tff = import_tff("the tff backend's fedsgd")

    del client_optimizer
    if aggregator is not None and is_unweighted(aggregator):
        aggregator = tff.aggregators.as_weighted_aggregator(aggregator)
    return tff.learning.algorithms.build_fed_sgd(
        model_fn, server_optimizer_fn=server_optimizer, model_aggregator=aggregator)


def client_work(optimizer: Any, hyperparameters: dict[str, Any]) -> Any:
    """FedSGD's client part on the compiled backend: batch gradients at the server weights."""
    from tensorfleet.federated.algorithms.client_work import BatchGradients

    del optimizer, hyperparameters
    return BatchGradients()
