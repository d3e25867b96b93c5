"""FedProx: federated optimization with a proximal term.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated Optimization in Heterogeneous
Networks", MLSys 2020. Local training minimises ``f_k(w) + mu/2 * ||w - w_t||^2``, which keeps
clients on heterogeneous data close to the global model. Built on
``tff.learning.algorithms.build_weighted_fed_prox`` with ``proximal_strength = mu``.
"""

from __future__ import annotations

from typing import Any

from tensorfleet.federated.algorithms.base import is_unweighted
from tensorfleet.validation import number

__all__ = ["build"]


def build(model_fn: Any, *, client_optimizer: Any, server_optimizer: Any, aggregator: Any = None,
          mu: float = 0.01) -> Any:
    """FedProx learning process with proximal strength ``mu`` (>= 0)."""
    import tensorflow_federated as tff

    number("mu", mu, minimum=0)
    if aggregator is not None and is_unweighted(aggregator):
        return tff.learning.algorithms.build_unweighted_fed_prox(
            model_fn, proximal_strength=float(mu), client_optimizer_fn=client_optimizer,
            server_optimizer_fn=server_optimizer, model_aggregator=aggregator)
    return tff.learning.algorithms.build_weighted_fed_prox(
        model_fn, proximal_strength=float(mu), client_optimizer_fn=client_optimizer,
        server_optimizer_fn=server_optimizer, model_aggregator=aggregator)
