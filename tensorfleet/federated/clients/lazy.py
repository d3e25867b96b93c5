"""Client data made when a round asks for it, for simulations with thousands of clients.

A :class:`LazyClientData` holds a function that makes one client's ``(x, y)`` from its index,
never the clients' data: a :class:`~tensorfleet.federated.Simulation` asks only for the
clients it samples in a round, so memory depends on the clients per round, not on the number
of clients. Each client is made from its own seed, so the same client always has the same data.

Two makers:

* :func:`emnist_like_clients`: EMNIST's federated shape (3,400 clients by default, 28x28
  images, 10 digit classes), made from ten class images (scikit-learn's mean digits, drawn at
  28x28) with per-client noise, shifts and label skew;
* :func:`digits_clients`: each client a seeded sample of scikit-learn's digits (8x8), so a
  simulation of any number of clients is checked against the digits test set.

Example (one round on 2 of 3,400 clients: only those two, and the first, are ever made):
    >>> import tensorflow as tf
    >>> from tensorfleet.federated import Simulation
    >>> clients = emnist_like_clients(num_clients=3400, examples_per_client=20)
    >>> def model_fn():
    ...     return tf.keras.Sequential([tf.keras.layers.Flatten(input_shape=(28, 28, 1)), tf.keras.layers.Dense(10)])
    >>> sim = Simulation(model_fn, clients, "fedavg", clients_per_round=2, rounds=1, progress=False)
    >>> history = sim.run()
    >>> history.final("num_examples")
    40
    >>> len(clients.materialized)
    3
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from tensorfleet.federated.clients.base import ClientData
from tensorfleet.validation import number, positive_int

__all__ = ["LazyClientData", "digits_clients", "emnist_like_clients"]

MakeClient = Callable[[int], "tuple[np.ndarray, np.ndarray]"]


class LazyClientData(ClientData):
    """Client data whose clients are made on request by ``make_client(index)``.

    Args:
        make_client: returns ``(x, y)`` numpy arrays of client ``index`` (same index, same data).
        num_clients: the number of clients.
        client_ids: their names; ``client_0000``, ... when None.
        description: free text kept with the data (shown in a simulation's config).
        record: keep the ids of the clients made, in order, in :attr:`materialized`.

    Example:
        >>> clients = LazyClientData(lambda i: (np.full((3, 2), i, np.float32), np.zeros(3, np.int32)), 1000)
        >>> clients.arrays("client_0007")[0][0]
        array([7., 7.], dtype=float32)
        >>> clients.materialized
        ['client_0000', 'client_0007']
    """

    def __init__(self, make_client: MakeClient, num_clients: int, *, client_ids: Sequence[str] | None = None,
                 description: str = "", record: bool = True) -> None:
        if not callable(make_client):
            raise TypeError(f"make_client must be a callable taking a client index. Received: {make_client!r}")
        positive_int("num_clients", num_clients)
        width = max(4, len(str(int(num_clients) - 1)))
        ids = list(client_ids) if client_ids is not None else [f"client_{i:0{width}d}" for i in range(num_clients)]
        if len(ids) != num_clients or len(set(ids)) != len(ids):
            raise ValueError(f"client_ids must be {num_clients} distinct names. Received: {len(ids)} names")
        self._make = make_client
        self._ids = ids
        self._position = {cid: i for i, cid in enumerate(ids)}
        self.description = description or f"lazy {num_clients} clients"
        self.record = record
        self.materialized: list[str] = []
        x, y = self.arrays(ids[0])  # one client fixes the element spec
        self._element_spec = collections.OrderedDict(
            x=tf.TensorSpec(x.shape[1:], tf.as_dtype(x.dtype)), y=tf.TensorSpec((), tf.as_dtype(y.dtype)))

    @property
    def client_ids(self) -> list[str]:
        return list(self._ids)

    @property
    def num_clients(self) -> int:
        return len(self._ids)

    @property
    def element_type_structure(self) -> Any:
        return self._element_spec

    def arrays(self, client_id: str) -> tuple[np.ndarray, np.ndarray]:
        """Makes ``(x, y)`` of one client (nothing is kept)."""
        try:
            index = self._position[client_id]
        except KeyError:
            raise ValueError(f"Unknown client id {client_id!r}; ids run from {self._ids[0]!r} to "
                             f"{self._ids[-1]!r}.") from None
        x, y = self._make(index)
        x, y = np.asarray(x), np.asarray(y)
        if len(x) != len(y) or len(y) == 0:
            raise ValueError(f"make_client({index}) must return non-empty x and y of the same length. "
                             f"Received: len(x)={len(x)}, len(y)={len(y)}")
        if self.record:
            self.materialized.append(client_id)
        return x, y

    def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
        x, y = self.arrays(client_id)
        return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))

    @property
    def serializable_dataset_fn(self) -> Any:
        """A dataset function of a client-id tensor; it calls back into Python, so it runs in this process."""
        spec = self._element_spec

        def dataset_fn(client_id: Any) -> tf.data.Dataset:
            def gen(cid: bytes) -> Any:
                x, y = self.arrays(cid.decode())
                for i in range(len(y)):
                    yield collections.OrderedDict(x=x[i], y=y[i])

            return tf.data.Dataset.from_generator(gen, args=(client_id,), output_signature=spec)

        return dataset_fn


def _emnist_templates() -> np.ndarray:
    """Ten class images (28x28 in [0, 1]), one per digit: the mean of scikit-learn's 8x8 digits of the
    class, each pixel drawn as a 3x3 block, centred with a 2-pixel margin (as EMNIST centres its digits)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    means = np.stack([bunch.images[bunch.target == k].mean(axis=0) for k in range(10)]) / 16.0
    templates = np.zeros((10, 28, 28), np.float32)
    templates[:, 2:26, 2:26] = np.kron(means, np.ones((3, 3)))
    return templates


def emnist_like_clients(num_clients: int = 3400, *, examples_per_client: int = 20, noise: float = 0.2,
                        label_alpha: float = 1.0, seed: int = 0) -> LazyClientData:
    """EMNIST-shaped clients (28x28x1 float32 in [0, 1], labels 0-9), each made when sampled.

    A client's labels come from a Dirichlet(``label_alpha``) over the classes; each example is
    its class image shifted by up to 2 pixels, plus Gaussian noise.

    Example:
        >>> clients = emnist_like_clients(3400)
        >>> clients.arrays("client_3399")[0].shape
        (20, 28, 28, 1)
    """
    positive_int("examples_per_client", examples_per_client)
    number("noise", noise, minimum=0)
    number("label_alpha", label_alpha, above=0)
    templates = _emnist_templates()

    def make(index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([seed, index])
        probs = rng.dirichlet(np.full(10, label_alpha))
        y = rng.choice(10, size=examples_per_client, p=probs).astype(np.int32)
        shifts = rng.integers(-2, 3, size=(examples_per_client, 2))
        x = np.stack([np.roll(templates[label], tuple(s), axis=(0, 1)) for label, s in zip(y, shifts)])
        x = np.clip(x + rng.normal(0.0, noise, size=x.shape), 0.0, 1.0).astype(np.float32)
        return x[..., None], y

    return LazyClientData(make, num_clients, description=f"emnist-like lazy {num_clients} clients, seed {seed}")


def digits_clients(num_clients: int, *, examples_per_client: int = 20, seed: int = 0,
                   x: np.ndarray | None = None, y: np.ndarray | None = None) -> LazyClientData:
    """Clients of scikit-learn's digits (training split), each a seeded sample made when asked.

    Example:
        >>> clients = digits_clients(3400, examples_per_client=20)
        >>> clients.arrays("client_0000")[0].shape
        (20, 8, 8, 1)
    """
    positive_int("examples_per_client", examples_per_client)
    if x is None or y is None:
        from tensorfleet.models import datasets

        split = datasets.load_digits()
        x, y = split.x_train, split.y_train
    x_all, y_all = np.asarray(x), np.asarray(y)
    if examples_per_client > len(y_all):
        raise ValueError(f"examples_per_client must not exceed the {len(y_all)} samples to draw from. "
                         f"Received: examples_per_client={examples_per_client}")

    def make(index: int) -> tuple[np.ndarray, np.ndarray]:
        rows = np.random.default_rng([seed, index]).choice(len(y_all), size=examples_per_client, replace=False)
        return x_all[rows], y_all[rows]

    return LazyClientData(make, num_clients, description=f"digits lazy {num_clients} clients, seed {seed}")
