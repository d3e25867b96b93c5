"""FedAvgM: server-optimizer variant of FedAvg.

Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification", 2019. FedAvg whose server applies the averaged client delta with SGD
momentum (FedAvgM).
Built on ``tff.learning.algorithms.build_weighted_fed_avg`` with a ``sgdm`` server optimizer; only
the registered defaults differ from ``fedavg``.
"""

from __future__ import annotations

from tensorfleet.federated.algorithms.fedavg import build

__all__ = ["build"]
