"""What a client does in a round of the compiled backend, one part per kind of algorithm:
:class:`LocalSteps` (the FedAvg family; FedProx with ``mu > 0``), :class:`BatchGradients` (FedSGD)
and :class:`NormalizedSteps` (FedNova). Each algorithm of
:data:`~tensorfleet.federated.algorithms.ALGORITHMS` names its part (``Algorithm.client_work``).

FedProx's pull is written once, :func:`proximal_gradients`, and serves both backends (the tff
backend's :class:`~tensorfleet.federated.algorithms.proximal.ProximalOptimizer` calls it).

FedNova (Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020), with plain local SGD: client ``k`` takes
``tau_k`` local steps and sends ``(w - w_k) / tau_k``; the server averages these weighted by
examples ``p_k`` and scales the mean by ``tau_eff = sum_k p_k tau_k``, so a client that ran more
steps (more data, or a straggler that ran fewer epochs) does not pull the model towards its own
objective more than its share.

Example (the proximal pull of ``mu = 0.5`` at ``w = 3`` from ``w_server = 1``):
    >>> import tensorflow as tf
    >>> [float(g) for g in proximal_gradients([tf.constant(0.25)], [tf.constant(3.0)], [tf.constant(1.0)], 0.5)]
    [1.25]
"""

from __future__ import annotations

from typing import Any, Sequence

from tensorfleet.validation import number

__all__ = ["BatchGradients", "ClientWork", "LocalSteps", "NormalizedSteps", "proximal_gradients"]


def proximal_gradients(gradients: Sequence[Any], weights: Sequence[Any], anchor: Sequence[Any], mu: Any) -> list[Any]:
    """``g + mu * (w - w_server)`` for every tensor: the gradient of FedProx's term
    ``(mu / 2) ||w - w_server||^2`` (Li et al., MLSys 2020) joined to the loss's (a ``None`` gradient
    is the term alone)."""
    out = []
    for g, w, a in zip(gradients, weights, anchor):
        term = mu * (w - a) if isinstance(mu, float) else _cast(mu, w) * (w - a)
        out.append(term if g is None else g + term)
    return out


def _cast(mu: Any, like: Any) -> Any:
    import tensorflow as tf

    return tf.cast(mu, like.dtype)


class ClientWork:
    """A client's work in the compiled round.

    Attributes:
        optimizer: the client optimizer (``initialize``/``next``), or None when no local steps are taken.
        local_steps: True: the client trains from the server weights and sends ``initial - trained``;
            False: it sends its batch gradients at the server weights, averaged weighted by batch size.
        normalized: True: the update is divided by the client's local steps and the server scales
            the mean by the example-weighted mean of the steps (FedNova).
    """

    optimizer: Any = None
    local_steps: bool = True
    normalized: bool = False

    def gradients(self, gradients: Sequence[Any], current: Sequence[Any], anchor: Sequence[Any]) -> Sequence[Any]:
        """The gradients the optimizer steps on, from the loss's, the client's weights and the server's."""
        return gradients


class LocalSteps(ClientWork):
    """Local epochs of ``optimizer`` from the server weights (TFF's model-delta client work), with
    FedProx's pull when ``mu > 0``."""

    def __init__(self, optimizer: Any, mu: float = 0.0) -> None:
        self.optimizer = optimizer
        self.mu = float(number("mu", mu, minimum=0))

    def gradients(self, gradients: Sequence[Any], current: Sequence[Any], anchor: Sequence[Any]) -> Sequence[Any]:
        return proximal_gradients(gradients, current, anchor, self.mu) if self.mu > 0 else gradients


class BatchGradients(ClientWork):
    """FedSGD (TFF's ``build_fed_sgd``): no local steps; the example-weighted mean of the client's
    batch gradients at the server weights."""

    local_steps = False


class NormalizedSteps(LocalSteps):
    """FedNova's client: local steps whose update is divided by how many it took (see the module docstring)."""

    normalized = True
