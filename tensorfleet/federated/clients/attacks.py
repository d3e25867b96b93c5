"""Byzantine clients for robustness experiments: clients whose data make them send bad updates.

TFF's client work is the real one, so an attacker is made the way a real faulty or malicious
device would be: through what it trains on. :func:`scale_clients` multiplies the features of
the chosen clients (their update grows with them: a scaled update); :func:`nan_clients` puts
NaN into their features (a NaN update; note that TFF's model-delta client work already zeroes a
non-finite delta and gives it weight 0, so FedAvg survives NaN updates but not large ones).

Example:
    >>> import numpy as np
    >>> from tensorfleet.federated import partition
    >>> clients = partition(np.ones((8, 2), np.float32), np.zeros(8, np.int32), num_clients=2, scheme="iid")
    >>> bad = scale_clients(clients, ["client_000"], factor=1e3)
    >>> bad.arrays("client_000")[0][0], bad.arrays("client_001")[0][0]
    (array([1000., 1000.], dtype=float32), array([1., 1.], dtype=float32))
    >>> bool(np.isnan(nan_clients(clients, ["client_001"]).arrays("client_001")[0]).all())
    True
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["scale_clients", "nan_clients"]


def _rebuild(clients: Any, client_ids: Sequence[str], transform: Any, label: str) -> Any:
    from tensorfleet.federated.clients.clientdata import ArrayClientData

    if not isinstance(clients, ArrayClientData):
        raise TypeError(f"clients must be an ArrayClientData (from partition()). Received: {type(clients).__name__}")
    unknown = [c for c in client_ids if c not in set(clients.client_ids)]
    if unknown:
        raise ValueError(f"Unknown client id {unknown[0]!r}. Received: client_ids={list(client_ids)}")
    x = clients.x.copy()
    for cid in client_ids:
        ix = clients.indices(cid)
        x[ix] = transform(x[ix])
    parts = [clients.indices(c) for c in clients.client_ids]
    return ArrayClientData(x, clients.y, parts, client_ids=clients.client_ids,
                           description=f"{clients.description} + {label} on {len(client_ids)} client(s)")


def scale_clients(clients: Any, client_ids: Sequence[str], *, factor: float) -> Any:
    """A copy of ``clients`` where the features of ``client_ids`` are multiplied by ``factor``.

    The clients' indices are their own rows: samples shared with no other client, so only the
    attackers' data change.
    """
    return _rebuild(clients, client_ids, lambda v: v * np.asarray(factor, dtype=v.dtype), f"x{factor:g} features")


def nan_clients(clients: Any, client_ids: Sequence[str]) -> Any:
    """A copy of ``clients`` where the features of ``client_ids`` are NaN."""
    return _rebuild(clients, client_ids, lambda v: np.full_like(v, np.nan), "NaN features")
