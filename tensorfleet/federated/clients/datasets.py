"""Named federated datasets for the CLI and scripts, in :data:`DATASETS`.

* ``digits``: scikit-learn's 8x8 digits (offline), pooled, partitioned with any scheme into
  ``num_clients`` (default 100), with a central test split.
* ``emnist_synthetic``: TFF's own ``tff.simulation.datasets.emnist.get_synthetic()`` (offline; on
  the tff track, as it needs tensorflow-federated) with TFF's client structure kept (2 clients of 10 examples each;
  ``num_clients`` takes the first ones); a partition scheme does not apply and no central test set exists. The real
  EMNIST (``tff.simulation.datasets.emnist.load_data``, which needs the network) is passed to
  :class:`~tensorfleet.federated.Simulation` as it is: its ``pixels``/``label`` are found by name.

Example:
    >>> clients, (x_test, y_test) = load_federated("digits", num_clients=100, scheme="shards:2")
    >>> len(clients.client_ids), x_test.shape
    (100, (359, 8, 8, 1))

On the tff track, TFF's own clients:
    >>> import tensorflow_federated as tff
    >>> clients, test = load_federated("emnist_synthetic")
    >>> clients.client_ids, test
    (['synthetic1', 'synthetic2'], None)
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tensorfleet.registry import Registry
from tensorfleet.validation import positive_int

__all__ = ["DATASETS", "load_federated"]

Loader = Callable[..., tuple[Any, "tuple[np.ndarray, np.ndarray] | None"]]
DATASETS: Registry[Loader] = Registry("dataset")


def _digits(*, num_clients: int | None, scheme: str | None, seed: int, flat: bool,
            **options: Any) -> tuple[Any, tuple[np.ndarray, np.ndarray]]:
    from tensorfleet.federated.clients.partition import partition
    from tensorfleet.models.datasets import load_digits

    s = load_digits(flat=flat, seed=seed)
    clients = partition(s.x_train, s.y_train, 100 if num_clients is None else num_clients, scheme or "iid", seed=seed,
                        **options)
    return clients, (s.x_test, s.y_test)


def _emnist_synthetic(*, num_clients: int | None, scheme: str | None, seed: int, flat: bool,
                      **options: Any) -> tuple[Any, None]:
    from tensorfleet.compat.tff import import_tff
    from tensorfleet.federated.clients.xy import xy_clients

    tff = import_tff("the emnist_synthetic dataset (TFF's own)")
    del seed
    if scheme is not None or options:
        raise ValueError(f"emnist_synthetic keeps TFF's own clients; a partition scheme re-splits pooled data "
                         f"(digits). Received: partition={scheme!r}")
    data = tff.simulation.datasets.emnist.get_synthetic()
    ids = list(data.client_ids)
    if num_clients is not None and positive_int("num_clients", num_clients) > len(ids):
        raise ValueError(f"num_clients must not exceed emnist_synthetic's {len(ids)} clients (TFF's own). "
                         f"Received: num_clients={num_clients}")
    if num_clients is not None and num_clients < len(ids):
        data = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(ids[:num_clients],
                                                                        data.create_tf_dataset_for_client)
    data.description = "tff.simulation.datasets.emnist.get_synthetic()"
    return xy_clients(data, x_shape=(784,) if flat else (28, 28, 1)), None


DATASETS.register("digits", _digits, description="scikit-learn digits, 8x8, 10 classes (offline), partitioned.")
DATASETS.register("emnist_synthetic", _emnist_synthetic,
                  description="TFF's synthetic EMNIST, 28x28 (offline), TFF's own 2 clients.")


def load_federated(name: str, *, num_clients: int | None = None, scheme: str | None = None, seed: int = 0,
                   flat: bool = False, **options: Any) -> tuple[Any, tuple[np.ndarray, np.ndarray] | None]:
    """``(clients, (x_test, y_test) or None)`` of dataset ``name``.

    ``num_clients`` and ``scheme`` split a pooled dataset (``digits``: default 100 clients, ``iid``);
    a dataset with clients of its own keeps them (``num_clients`` takes the first ones) and
    refuses a scheme. ``flat`` gives features as vectors (for MLPs).
    """
    return DATASETS.get(name)(num_clients=num_clients, scheme=scheme, seed=seed, flat=flat, **options)
