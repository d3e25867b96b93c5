"""FedProx's local step as a TFF optimizer: :class:`ProximalOptimizer`.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated Optimization in Heterogeneous
Networks", MLSys 2020: client ``k`` approximately minimizes
``h_k(w; w_t) = F_k(w) + mu/2 * ||w - w_t||^2`` from the server model ``w_t``, so every local
step follows ``grad F_k(w) + mu * (w - w_t)``, which pulls the client back towards ``w_t``.

TFF 0.87's ``tff.learning.algorithms.build_weighted_fed_prox`` adds ``mu * (w_t - w)`` instead
(``tensorflow_federated/python/learning/templates/proximal_client_work.py``), the gradient of
``-mu/2 * ||w - w_t||^2``: it pushes clients away from the server model. Wrapping the client
optimizer of TFF's FedAvg (whose model-delta client work starts every client from ``w_t`` and
takes its first step there) gives the paper's FedProx with everything else TFF's: broadcast,
client work, metrics, aggregation and the server's apply-optimizer finalizer. (The pull is
:func:`~tensorfleet.federated.algorithms.client_work.proximal_gradients`, which the compiled
backend's FedProx client work calls as well.) Its base class is TFF's, so the class is made when
first asked for, on the tff track.

Example (one SGD step of lr 0.5 from w = 2 with gradient 1; the anchor is 2, so no pull yet,
then a second step from 1.5 adds mu * (1.5 - 2) = -0.5 * mu):
    >>> import tensorflow as tf
    >>> import tensorflow_federated as tff
    >>> from tensorfleet.federated.algorithms.proximal import ProximalOptimizer
    >>> opt = ProximalOptimizer(tff.learning.optimizers.build_sgdm(0.5), mu=1.0)
    >>> state = opt.initialize((tf.TensorSpec([], tf.float32),))
    >>> state, w = opt.next(state, (tf.constant(2.0),), (tf.constant(1.0),))
    >>> state, w = opt.next(state, w, (tf.constant(1.0),))
    >>> float(w[0])  # 1.5 - 0.5 * (1 + 1.0 * (1.5 - 2))
    1.25
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import tensorflow as tf

from tensorfleet.federated.algorithms.client_work import proximal_gradients
from tensorfleet.validation import number

__all__ = ["PROXIMAL_STRENGTH_KEY"]  # and ProximalOptimizer, made on use

# The hyperparameter (in the client work's state, beside the client optimizer's own) that holds mu.
PROXIMAL_STRENGTH_KEY = "proximal_strength"


@functools.lru_cache(maxsize=None)
def _optimizer_class() -> type:
    """:class:`ProximalOptimizer`, made on first use: its base class is TFF's."""
    from tensorfleet.compat.tff import import_tff

    tff: Any = import_tff("ProximalOptimizer (FedProx on the tff backend)")  # its classes are bases here

    class ProximalOptimizer(tff.learning.optimizers.Optimizer):
        """``optimizer`` stepping on ``F_k(w) + mu/2 * ||w - w_t||^2``, with ``w_t`` the weights of its first step.

        A client's optimizer state is made afresh for every client and round (TFF's model-delta client
        work does so), and its first step is taken at the server weights ``w_t``: the state keeps them
        as the anchor, and every step adds ``mu * (w - w_t)`` to the gradients before ``optimizer``
        steps.

        Args:
            optimizer: a ``tff.learning.optimizers.Optimizer`` (SGD, momentum, Adam...).
            mu: the proximal strength (>= 0; 0 steps as ``optimizer`` alone).
        """

        def __init__(self, optimizer: Any, mu: float) -> None:
            if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
                raise TypeError("optimizer must be a tff.learning.optimizers.Optimizer. Received: "
                                f"{type(optimizer).__name__}")
            self.optimizer = optimizer
            self.mu = float(number("mu", mu, minimum=0))

        def initialize(self, specs: Any) -> Any:
            return collections.OrderedDict(
                optimizer=self.optimizer.initialize(specs),
                proximal_strength=self.mu,  # a Python number, as TFF's optimizers keep their hyperparameters
                anchor=tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs),
                anchored=tf.constant(False))

        def next(self, state: Any, weights: Any, gradients: Any) -> tuple[Any, Any]:
            anchored = state["anchored"]
            anchor = tf.nest.map_structure(lambda a, w: tf.where(anchored, a, w), state["anchor"], weights)
            mu = state["proximal_strength"]
            pulled = proximal_gradients(tf.nest.flatten(gradients), tf.nest.flatten(weights), tf.nest.flatten(anchor),
                                        tf.convert_to_tensor(mu))
            gradients = tf.nest.pack_sequence_as(gradients, pulled)
            inner, weights = self.optimizer.next(state["optimizer"], weights, gradients)
            return collections.OrderedDict(optimizer=inner, proximal_strength=mu, anchor=anchor,
                                           anchored=tf.constant(True)), weights

        def get_hparams(self, state: Any) -> Any:
            hparams = collections.OrderedDict(self.optimizer.get_hparams(state["optimizer"]))
            hparams[PROXIMAL_STRENGTH_KEY] = state["proximal_strength"]
            return hparams

        def set_hparams(self, state: Any, hparams: Any) -> Any:
            inner = collections.OrderedDict((k, v) for k, v in hparams.items() if k != PROXIMAL_STRENGTH_KEY)
            updated = collections.OrderedDict(state)
            updated["optimizer"] = self.optimizer.set_hparams(state["optimizer"], inner)
            if PROXIMAL_STRENGTH_KEY in hparams:
                updated["proximal_strength"] = hparams[PROXIMAL_STRENGTH_KEY]
            return updated

    ProximalOptimizer.__module__ = __name__
    return ProximalOptimizer


def __getattr__(name: str) -> Any:
    if name == "ProximalOptimizer":  # made on first use: it needs tensorflow-federated
        return _optimizer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
