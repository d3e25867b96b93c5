"""tensorfleet's client-data type: :class:`ClientData`, the clients of a simulation, without TFF.

It has the interface of ``tff.simulation.datasets.ClientData`` that simulations and their users
rely on (``client_ids``, ``element_type_structure``, ``create_tf_dataset_for_client``,
``serializable_dataset_fn``, ``preprocess``, ``datasets``, ``create_tf_dataset_from_all_clients``,
``from_clients_and_tf_fn``), so data made for TFF reads the same, and
:func:`as_client_data` takes a TFF ``ClientData`` as it is (read through, client by client). The
``tff`` backend hands TFF what it needs (``tf.data`` datasets per round), so it needs no TFF
``ClientData`` of ours; :func:`to_tff` makes one where TFF's own API is wanted.

Example:
    >>> import collections
    >>> import tensorflow as tf
    >>> def dataset(cid):
    ...     n = int(cid[-1]) + 1
    ...     return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=tf.ones([n, 2]),
    ...                                                                       y=tf.zeros([n], tf.int32)))
    >>> clients = ClientData.from_clients_and_tf_fn(["a0", "a1"], dataset)
    >>> clients.client_ids, [len(list(ds)) for ds in clients.datasets()]
    (['a0', 'a1'], [1, 2])
    >>> doubled = clients.preprocess(lambda ds: ds.map(lambda e: collections.OrderedDict(x=e["x"] * 2, y=e["y"])))
    >>> next(iter(doubled.create_tf_dataset_for_client("a1")))["x"].numpy()
    array([2., 2.], dtype=float32)
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

__all__ = ["ClientData", "ReadClientData", "as_client_data", "to_tff", "with_arrays"]


class ClientData:
    """Clients by id, each a ``tf.data.Dataset`` of examples.

    Subclasses define :attr:`client_ids`, :meth:`create_tf_dataset_for_client` and, when their
    examples are known without reading one, :attr:`element_type_structure` (read from the first
    client's dataset otherwise). ``description`` is free text a simulation shows and records.
    """

    description: str = ""

    @property
    def client_ids(self) -> list[str]:  # pragma: no cover - the protocol
        raise NotImplementedError

    def create_tf_dataset_for_client(self, client_id: str) -> Any:  # pragma: no cover - the protocol
        raise NotImplementedError

    @property
    def element_type_structure(self) -> Any:
        return self.create_tf_dataset_for_client(self.client_ids[0]).element_spec

    @property
    def serializable_dataset_fn(self) -> Callable[[Any], Any]:
        """A function of a client-id tensor to its dataset; here it calls back into Python (so it
        runs in this process), subclasses give a traceable one where they can."""
        import tensorflow as tf

        spec = self.element_type_structure

        def dataset_fn(client_id: Any) -> Any:
            def examples(cid: bytes) -> Any:
                yield from self.create_tf_dataset_for_client(cid.decode()).as_numpy_iterator()

            return tf.data.Dataset.from_generator(examples, args=(client_id,), output_signature=spec)

        return dataset_fn

    def datasets(self, limit_count: int | None = None, seed: Any = None) -> Iterator[Any]:
        """The clients' datasets in id order (``limit_count`` of them; shuffled ids with ``seed``)."""
        import numpy as np

        ids = list(self.client_ids)
        if seed is not None:
            ids = [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]
        for cid in ids[:limit_count]:
            yield self.create_tf_dataset_for_client(cid)

    def create_tf_dataset_from_all_clients(self, seed: Any = None) -> Any:
        """Every client's examples in one dataset (clients in id order, or shuffled with ``seed``)."""
        import functools

        return functools.reduce(lambda a, b: a.concatenate(b), self.datasets(seed=seed))

    def preprocess(self, preprocess_fn: Callable[[Any], Any]) -> "ClientData":
        """This data with ``preprocess_fn`` applied to every client's dataset."""
        if not callable(preprocess_fn):
            raise TypeError(f"preprocess_fn must be a callable on a tf.data.Dataset. Received: {preprocess_fn!r}")
        return _Preprocessed(self, preprocess_fn)

    @classmethod
    def from_clients_and_tf_fn(cls, client_ids: Sequence[str], serializable_dataset_fn: Callable[[Any], Any]
                               ) -> "ClientData":
        """Client data whose client ``cid``'s dataset is ``serializable_dataset_fn(cid)``."""
        ids = [str(c) for c in client_ids]
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"client_ids must be distinct names, at least one. Received: {len(ids)} names, "
                             f"{len(set(ids))} distinct")
        return _FromFn(ids, serializable_dataset_fn)


class _FromFn(ClientData):
    def __init__(self, client_ids: list[str], dataset_fn: Callable[[Any], Any]) -> None:
        self._ids, self._fn = client_ids, dataset_fn
        self._known = set(client_ids)

    @property
    def client_ids(self) -> list[str]:
        return list(self._ids)

    def create_tf_dataset_for_client(self, client_id: str) -> Any:
        if client_id not in self._known:
            raise ValueError(f"Unknown client id {client_id!r}; ids run from {self._ids[0]!r} to {self._ids[-1]!r}.")
        return self._fn(client_id)

    @property
    def serializable_dataset_fn(self) -> Callable[[Any], Any]:
        return self._fn


class _Preprocessed(ClientData):
    def __init__(self, base: Any, fn: Callable[[Any], Any]) -> None:
        self._base, self._fn = base, fn
        self._spec = fn(base.create_tf_dataset_for_client(base.client_ids[0])).element_spec

    @property
    def client_ids(self) -> list[str]:
        return list(self._base.client_ids)

    @property
    def element_type_structure(self) -> Any:
        return self._spec

    def create_tf_dataset_for_client(self, client_id: str) -> Any:
        return self._fn(self._base.create_tf_dataset_for_client(client_id))

    @property
    def serializable_dataset_fn(self) -> Callable[[Any], Any]:
        inner = self._base.serializable_dataset_fn
        return lambda client_id: self._fn(inner(client_id))


class _Delegating(ClientData):
    """Client data read through from ``data``: its ids, datasets and element structure, as they are."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.description = getattr(data, "description", "") or type(data).__name__

    @property
    def client_ids(self) -> list[str]:
        return list(self.data.client_ids)

    @property
    def element_type_structure(self) -> Any:
        return self.data.element_type_structure

    def create_tf_dataset_for_client(self, client_id: str) -> Any:
        return self.data.create_tf_dataset_for_client(client_id)

    @property
    def serializable_dataset_fn(self) -> Callable[[Any], Any]:
        return self.data.serializable_dataset_fn


class _FromTff(_Delegating):
    """A TFF ``ClientData`` read through."""


class ReadClientData(_Delegating):
    """Client data of ``OrderedDict(x=..., y=...)`` examples with :meth:`arrays`, read from each client's
    dataset when asked (for data that keeps no arrays: TFF's, or preprocessed), so every backend
    and sampler reads any client data as it reads ``partition()``'s."""

    def arrays(self, client_id: str) -> tuple[Any, Any]:
        """``(x, y)`` numpy arrays of one client (its dataset read once)."""
        from tensorfleet.federated.clients.clientdata import client_arrays

        return client_arrays(self.data, client_id)


def with_arrays(data: ClientData) -> ClientData:
    """``data`` when it has ``arrays(client_id)``, else a :class:`ReadClientData` over it."""
    return data if hasattr(data, "arrays") else ReadClientData(data)


def as_client_data(data: Any) -> ClientData:
    """``data`` as tensorfleet's :class:`ClientData`: itself when it is one; a TFF ``ClientData``
    (or any object with ``client_ids`` and ``create_tf_dataset_for_client``) read through.

    Raises:
        TypeError: ``data`` has no clients.
    """
    if isinstance(data, ClientData):
        return data
    if hasattr(data, "client_ids") and hasattr(data, "create_tf_dataset_for_client"):
        return _FromTff(data)
    raise TypeError("clients must be client data: tensorfleet.federated.partition(...), a "
                    "tensorfleet.federated.clients.base.ClientData, or a tff.simulation.datasets.ClientData. "
                    f"Received: {type(data).__name__}")


def to_tff(data: ClientData) -> Any:
    """``data`` as a ``tff.simulation.datasets.ClientData`` (needs tensorflow-federated): TFF's own
    when ``data`` wraps one, else one over ``data``'s datasets."""
    while isinstance(data, ReadClientData):
        data = data.data
    if isinstance(data, _FromTff):
        return data.data
    from tensorfleet.compat.tff import import_tff

    tff = import_tff("a TFF ClientData")
    return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(data.client_ids, data.serializable_dataset_fn)
