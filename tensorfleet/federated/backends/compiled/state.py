"""The server's state of the compiled engine as variables: read for checkpoints, loaded back, and bound anew.

:class:`ServerVariables` is the part of :class:`~tensorfleet.federated.backends.compiled.engine.CompiledFedAvg`
that handles the variables the round updates in place (the server's weights, optimizer state,
non-trainable weights, the aggregator's state and FedBN's rows): :meth:`~ServerVariables.state_leaves` and
:meth:`~ServerVariables.load_leaves` for checkpoints, and :meth:`~ServerVariables.rebind`, which makes them
new variables so that a round's call abandoned on a frozen worker
(:mod:`~tensorfleet.federated.backends.compiled.workers`) can never change the state, even if it ends later.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["ServerVariables"]


class ServerVariables:
    """The engine's server variables as arrays (checkpoints) and their rebinding (frozen workers)."""

    _weight_vars: list[Any]
    _frozen_vars: list[Any]
    _state_vars: Any
    _part_vars: dict[str, Any]
    _part_keys: list[str]
    _local: Any
    _local_rows: Any
    _round: Any
    _apply: Any
    _copy: Any

    def _targets(self) -> list[Any]:
        import tensorflow as tf

        return [*self._weight_vars, *tf.nest.flatten(self._state_vars), *self._frozen_vars,
                *(self._part_vars[k] for k in self._part_keys)]

    def state_leaves(self) -> list[np.ndarray]:
        """Weights, server optimizer state, non-trainable weights and the aggregator's state (for checkpoints),
        then FedBN's per-client ids and rows."""
        return [v.numpy() for v in self._targets()] + (self._local.leaves() if self._local is not None else [])

    @property
    def ragged_leaves(self) -> tuple[int, ...]:
        """The leaves whose first axis grows with the clients sampled (FedBN's ids and rows)."""
        n = len(self._targets())
        return (n, n + 1) if self._local is not None else ()

    def load_leaves(self, leaves: Sequence[np.ndarray]) -> None:
        targets = self._targets()
        if self._local is not None and len(leaves) == len(targets) + 2:
            self._local.load(*leaves[-2:])
            leaves = leaves[:-2]
        if len(leaves) != len(targets):
            raise ValueError(f"A checkpoint of this backend holds {len(targets)} tensors. Received: {len(leaves)}")
        expected = [tuple(v.shape) for v in targets]
        if [tuple(np.shape(v)) for v in leaves] != expected:
            raise ValueError(f"A checkpoint's tensor shapes do not match this model's {expected[:6]}... (another "
                             "model?).")
        for var, value in zip(targets, leaves):
            var.assign(np.asarray(value, dtype=var.dtype.as_numpy_dtype))

    def rebind(self, leaves: Sequence[np.ndarray]) -> None:
        """Gives the server's state new variables holding ``leaves`` (:meth:`state_leaves` of before a round
        whose call was abandoned): should that call end later, it writes only the variables it was traced
        with, which nothing reads any more. The round and the weights' copy are traced again."""
        import tensorflow as tf

        with tf.init_scope():
            fresh = lambda v: tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False)  # noqa: E731
            self._weight_vars = [fresh(v) for v in self._weight_vars]
            self._frozen_vars = [fresh(v) for v in self._frozen_vars]
            self._state_vars = tf.nest.map_structure(fresh, self._state_vars)
            self._part_vars = {k: fresh(v) for k, v in self._part_vars.items()}
            if self._local is not None:
                self._local_rows = fresh(self._local_rows)
        self.load_leaves(leaves)
        self._round = self._apply = self._copy = None
