"""Named federated datasets for the CLI and scripts, in :data:`DATASETS`.

* ``digits``: scikit-learn's 8x8 digits (offline), partitioned with any scheme.
* ``emnist_synthetic``: TFF's own ``tff.simulation.datasets.emnist.get_synthetic()`` (offline),
  its examples gathered and re-partitioned into the requested number of clients. The real EMNIST
  loader (``tff.simulation.datasets.emnist.load_data``) needs the network; its ClientData can be
  passed to :class:`~tensorfleet.federated.Simulation` after ``preprocess`` renames its
  ``pixels``/``label`` to ``x``/``y``.

Example:
    >>> clients, test = load_federated("digits", num_clients=100, scheme="shards:2")
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tensorfleet.registry import Registry

__all__ = ["DATASETS", "load_federated", "load_arrays"]

DATASETS: Registry[Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = Registry("dataset")


def _digits(*, flat: bool, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from tensorfleet.models.datasets import load_digits

    s = load_digits(flat=flat, seed=seed)
    return s.x_train, s.y_train, s.x_test, s.y_test


def _emnist_synthetic(*, flat: bool, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    import tensorflow_federated as tff

    cd = tff.simulation.datasets.emnist.get_synthetic()
    xs, ys = [], []
    for cid in cd.client_ids:
        for element in cd.create_tf_dataset_for_client(cid).as_numpy_iterator():
            xs.append(element["pixels"])
            ys.append(element["label"])
    x = np.asarray(xs, dtype=np.float32)
    y = np.asarray(ys, dtype=np.int32)
    x = x.reshape(len(x), -1) if flat else x[..., None]
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = max(1, len(x) // 5)
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


DATASETS.register("digits", _digits, description="scikit-learn digits, 8x8, 10 classes (offline).")
DATASETS.register("emnist_synthetic", _emnist_synthetic,
                  description="TFF's synthetic EMNIST, 28x28 (offline), re-partitioned.")


def load_arrays(name: str, *, flat: bool = False, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)`` of dataset ``name``."""
    return DATASETS.get(name)(flat=flat, seed=seed)


def load_federated(name: str, *, num_clients: int, scheme: str = "iid", seed: int = 0, flat: bool = False,
                   **options: Any) -> tuple[Any, tuple[np.ndarray, np.ndarray]]:
    """``(clients, (x_test, y_test))``: dataset ``name`` partitioned into ``num_clients``."""
    from tensorfleet.federated.clients.partition import partition

    x, y, x_test, y_test = load_arrays(name, flat=flat, seed=seed)
    return partition(x, y, num_clients, scheme, seed=seed, **options), (x_test, y_test)
