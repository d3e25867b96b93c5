"""FedNova: normalized averaging.

Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020. With local SGD, client ``k`` takes ``tau_k`` steps and
sends ``(w - w_k) / tau_k``; the server averages these weighted by examples and scales the mean by
the example-weighted mean of the ``tau_k`` (:class:`~tensorfleet.federated.algorithms.client_work.NormalizedSteps`).
Clients that take different numbers of steps (stragglers that run fewer local epochs, clients with
more data) then move the model by their share, not by their steps.

Runs on the compiled backend (TFF has no FedNova): its ``build`` is None.
"""

from __future__ import annotations

from typing import Any

__all__ = ["client_work"]


def client_work(optimizer: Any, hyperparameters: dict[str, Any]) -> Any:
    """FedNova's client part: local steps, the update normalized by their number."""
    from tensorfleet.federated.algorithms.client_work import NormalizedSteps

    return NormalizedSteps(optimizer)
