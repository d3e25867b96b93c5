"""FedAvg: federated averaging.

McMahan, Moore, Ramage, Hampson and Agüera y Arcas, "Communication-Efficient Learning of Deep
Networks from Decentralized Data", AISTATS 2017. Clients run local SGD epochs; the server
averages their model deltas weighted by example count. Built on
``tff.learning.algorithms.build_weighted_fed_avg`` (``build_unweighted_fed_avg`` with an
unweighted aggregator such as DP or a robust one).
"""

from __future__ import annotations

from typing import Any

from tensorfleet.federated.algorithms.base import is_unweighted

__all__ = ["build"]


def build(model_fn: Any, *, client_optimizer: Any, server_optimizer: Any, aggregator: Any = None) -> Any:
    """FedAvg learning process; see the module docstring."""
    from tensorfleet.compat.tff import import_tff

    tff = import_tff("the tff backend's fedavg")

    if aggregator is not None and is_unweighted(aggregator):
        return tff.learning.algorithms.build_unweighted_fed_avg(
            model_fn, client_optimizer_fn=client_optimizer, server_optimizer_fn=server_optimizer,
            model_aggregator=aggregator)
    return tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer_fn=client_optimizer, server_optimizer_fn=server_optimizer,
        model_aggregator=aggregator)
