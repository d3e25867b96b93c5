"""FedAdagrad: server-optimizer variant of FedAvg.

Reddi et al., "Adaptive Federated Optimization", ICLR 2021: FedAvg with the Adagrad server optimizer
(FedAdagrad).
Built on ``tff.learning.algorithms.build_weighted_fed_avg`` with a ``adagrad`` server optimizer; only
the registered defaults differ from ``fedavg``.
"""

from __future__ import annotations

from tensorfleet.federated.algorithms.fedavg import build

__all__ = ["build"]
