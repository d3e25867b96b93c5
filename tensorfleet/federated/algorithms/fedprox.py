"""FedProx: federated optimization with a proximal term.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated Optimization in Heterogeneous
Networks", MLSys 2020. Local training minimises ``f_k(w) + mu/2 * ||w - w_t||^2``: every local
gradient gets ``+ mu * (w - w_t)``, which keeps clients on heterogeneous data close to the global
model ``w_t``.

Built as TFF's FedAvg (``build_weighted_fed_avg``, or ``build_unweighted_fed_avg`` with an
unweighted aggregator) whose client optimizer steps on that objective
(:class:`~tensorfleet.federated.algorithms.proximal.ProximalOptimizer`). Not on
``tff.learning.algorithms.build_weighted_fed_prox``: TFF 0.87's adds ``mu * (w_t - w)``, the
opposite sign, which pushes clients away from the server model.
"""

from __future__ import annotations

from typing import Any

from tensorfleet.validation import number

__all__ = ["build"]


def build(model_fn: Any, *, client_optimizer: Any, server_optimizer: Any, aggregator: Any = None,
          mu: float = 0.01) -> Any:
    """FedProx learning process with proximal strength ``mu`` (>= 0; 0 is FedAvg)."""
    from tensorfleet.federated.algorithms import fedavg
    from tensorfleet.federated.algorithms.proximal import ProximalOptimizer

    number("mu", mu, minimum=0)
    return fedavg.build(model_fn, client_optimizer=ProximalOptimizer(client_optimizer, mu),
                        server_optimizer=server_optimizer, aggregator=aggregator)
