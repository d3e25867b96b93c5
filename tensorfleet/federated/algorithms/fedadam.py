"""FedAdam: server-optimizer variant of FedAvg.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan, "Adaptive Federated
Optimization", ICLR 2021. FedAvg whose server treats the averaged client delta as a
pseudo-gradient for Adam (FedAdam).
Built on ``tff.learning.algorithms.build_weighted_fed_avg`` with a ``adam`` server optimizer; only
the registered defaults differ from ``fedavg``.
"""

from __future__ import annotations

from tensorfleet.federated.algorithms.fedavg import build

__all__ = ["build"]
