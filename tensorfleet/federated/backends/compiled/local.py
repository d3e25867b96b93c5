"""FedBN on the compiled backend (``non_trainable="per_client"``): :class:`LocalLayers`, the
BatchNormalization layers every client keeps to itself.

FedBN (Li, Jiang, Zhang, Kamp and Dou, "FedBN: Federated Learning on Non-IID Features via Local
Batch Normalization", ICLR 2021) averages every weight but those of the BatchNormalization layers:
each client keeps its own BN parameters (``gamma``, ``beta``) and statistics (moving mean and
variance) from round to round. Here:

* a client's BN layers start a round where its last round left them; a client sampled for the first
  time starts from the server's (below);
* its update has zeros where the BN parameters are (they are not sent), so the aggregator and the
  server optimizer see the shared weights only;
* the server's own BN layers (the global model, used by central and federated evaluation, and by a
  client that has none yet) are the example-weighted mean of the round's participants' BN layers
  after their local steps;
* state is held only for clients that have been sampled (one row of ``size`` float32 each) and is
  checkpointed with the model (:meth:`LocalLayers.leaves`).

Every non-trainable weight counts as local (BatchNormalization's statistics are the usual ones).

Example:
    >>> import tensorflow as tf
    >>> model = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,)),
    ...                              tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(2)])
    >>> local = LocalLayers(model)
    >>> local.trainable, local.size   # gamma and beta, then the two statistics: 4 vectors of 3
    ([2, 3], 12)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tensorfleet.compat.keras import model_variables, module_of, sublayers

__all__ = ["GLOBAL_BN", "LocalLayers", "batch_norm_variables", "check_per_client"]

GLOBAL_BN = ("the example-weighted mean of the last round's participants' BatchNormalization layers "
             "(non_trainable='per_client': each client trains and is evaluated with its own)")


def check_per_client(*, tff: bool, received: str, local_steps: bool = True) -> None:
    """ValueError when FedBN (``non_trainable='per_client'``) cannot run: on the tff backend (``tff``:
    the rounds would run there; ``received`` names what was asked), or with an algorithm that takes no
    local steps (``local_steps`` False: FedSGD), whose clients never train their own layers.

    Example:
        >>> check_per_client(tff=True, received="backend='tff'")
        Traceback (most recent call last):
        ValueError: non_trainable='per_client' (FedBN: each client keeps its own BatchNormalization layers) runs on
        backend='compiled' only; TFF's learning processes keep no state of a client between rounds. Received:
        non_trainable='per_client' with backend='tff'; use backend='compiled' (or 'auto' without workers).
    """
    if tff:
        raise ValueError("non_trainable='per_client' (FedBN: each client keeps its own BatchNormalization layers) "
                         "runs on backend='compiled' only; TFF's learning processes keep no state of a client "
                         f"between rounds. Received: non_trainable='per_client' with {received}; use "
                         "backend='compiled' (or 'auto' without workers).")
    if not local_steps:
        raise ValueError("non_trainable='per_client' keeps each client's BatchNormalization layers, which its local "
                         f"steps train; {received} takes none. Received: non_trainable='per_client' with {received}; "
                         "use 'mean' or 'initial', or an algorithm with local steps.")


def batch_norm_variables(model: Any) -> list[int]:
    """The positions in ``model.trainable_variables`` of its BatchNormalization layers' variables
    (nested models and layers included)."""

    norm = module_of(model, "non_trainable='per_client'").layers.BatchNormalization
    owned = {id(v) for layer in sublayers(model) if isinstance(layer, norm)
             for v in model_variables(layer)[0]}
    return [i for i, v in enumerate(model_variables(model)[0]) if id(v) in owned]


class LocalLayers:
    """The per-client BatchNormalization state of a FedBN run (see the module).

    A client's row is its BN layers' trainable variables (in the model's order) followed by every
    non-trainable variable, each flattened.

    Attributes:
        trainable: positions of the BN layers' variables among the model's trainable variables.
        sizes: the row's pieces' sizes (``trainable``'s, then the non-trainable variables').
        size: the row's length.
        states: client id -> its row (float32), for the clients that have been sampled.
    """

    def __init__(self, model: Any) -> None:
        self.trainable = batch_norm_variables(model)
        variables, non_trainable = model_variables(model)
        pieces = [variables[i] for i in self.trainable] + non_trainable
        self.sizes = [int(np.prod(v.shape)) for v in pieces]
        self.size = int(sum(self.sizes))
        self.states: dict[str, np.ndarray] = {}

    def shared_mask(self, sizes: Sequence[int]) -> np.ndarray:
        """A flat trainable vector's mask: 1 where a weight is averaged, 0 where it is a BN layer's."""
        mask = [np.full(n, 0.0 if i in self.trainable else 1.0, np.float32) for i, n in enumerate(sizes)]
        return np.concatenate(mask) if mask else np.zeros(0, np.float32)

    def server_row(self, weights: Sequence[np.ndarray], non_trainable: Sequence[np.ndarray]) -> np.ndarray:
        """The server's BN layers as a row (the start of a client sampled for the first time)."""
        pieces = [np.ravel(weights[i]) for i in self.trainable] + [np.ravel(w) for w in non_trainable]
        return np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)

    def rows(self, client_ids: Sequence[str], server: np.ndarray, slots: int) -> np.ndarray:
        """The round's ``[slots, size]`` starting rows: each participant's own, else the server's."""
        out = np.zeros((slots, self.size), np.float32)
        for k, cid in enumerate(client_ids):
            out[k] = self.states.get(cid, server)
        return out

    def keep(self, client_ids: Sequence[str], rows: np.ndarray) -> None:
        """Stores the participants' rows after their local steps (a client whose row is not finite
        keeps its previous one, as its update is left out)."""
        for cid, row in zip(client_ids, np.asarray(rows)):
            if np.all(np.isfinite(row)):
                self.states[cid] = np.array(row, np.float32)

    def start(self, weights: list[Any], row: Any, specs: Sequence[Any],
              frozen: Sequence[Any]) -> tuple[list[Any], list[Any], Any]:
        """``(trainable, non-trainable, flat trainable)`` a client starts from: the server's ``weights`` with the
        BN layers of its ``row`` (``specs``: the trainable weights' specs; ``frozen``: the non-trainable ones)."""
        import tensorflow as tf

        from tensorfleet.federated.backends.compiled.layout import flatten

        bn, frozen_row = self.split(row)
        start = list(weights)
        for t, piece in zip(self.trainable, bn):
            start[t] = tf.reshape(piece, specs[t].shape)
        return start, [tf.reshape(p, v.shape) for p, v in zip(frozen_row, frozen)], flatten(start)

    def split(self, row: Any) -> tuple[list[Any], list[Any]]:
        """A row (tensor) as ``(BN trainable pieces, non-trainable pieces)``, flat."""
        import tensorflow as tf

        pieces = tf.split(row, self.sizes) if self.sizes else []
        return pieces[:len(self.trainable)], pieces[len(self.trainable):]

    def client(self, client_id: str, weights: Sequence[np.ndarray],
               non_trainable: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray], bool]:
        """``(trainable, non_trainable, own)``: the server's weights with ``client_id``'s BN layers
        (``own`` False: it has none yet, the server's are given)."""
        row = self.states.get(client_id)
        if row is None:
            return [np.array(w) for w in weights], [np.array(w) for w in non_trainable], False
        pieces = np.split(row, np.cumsum(self.sizes)[:-1]) if self.sizes else []
        trainable = [np.array(w) for w in weights]
        for i, piece in zip(self.trainable, pieces):
            trainable[i] = piece.reshape(np.shape(weights[i]))
        frozen = [p.reshape(np.shape(w)) for p, w in zip(pieces[len(self.trainable):], non_trainable)]
        return trainable, frozen, True

    def leaves(self) -> list[np.ndarray]:
        """The states for a checkpoint: the clients' ids (sorted) and their rows ``[clients, size]``."""
        ids = sorted(self.states)
        rows = np.stack([self.states[c] for c in ids]) if ids else np.zeros((0, self.size), np.float32)
        return [np.array(ids, dtype=np.str_), rows]

    def load(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Restores :meth:`leaves`; ValueError when the rows are not of this model's BN layers."""
        if np.ndim(rows) != 2 or np.shape(rows)[1] != self.size or len(ids) != len(rows):
            raise ValueError(f"A checkpoint's per-client BatchNormalization state must be {len(ids)} rows of "
                             f"{self.size} values. Received: shape {np.shape(rows)} (another model?).")
        self.states = {str(c): np.asarray(r, np.float32) for c, r in zip(ids, rows)}
