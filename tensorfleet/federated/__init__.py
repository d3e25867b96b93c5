"""Federated learning simulations on tensorflow-federated.

* :func:`partition` splits ``(x, y)`` into clients (``iid``, ``dirichlet``, ``shards``,
  ``quantity``) as a ``tff.simulation.datasets.ClientData``; :func:`summarize` and
  :func:`plot_label_distribution` describe any ClientData.
* :data:`ALGORITHMS` (fedavg, fedsgd, fedprox, fedavgm, fedadam, fedyogi, fedadagrad) and
  :data:`AGGREGATORS` (mean, DP, compression, median, trimmed mean, Krum) are registries.
* :class:`Simulation` runs the rounds; :mod:`~tensorfleet.federated.backends.tff` owns TFF's C++
  worker process so that none outlives Python.

TensorFlow and TFF are imported only when something needs them.

Example:
    >>> import tensorfleet as tfl
    >>> split = tfl.models.datasets.load_digits()
    >>> clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=100,
    ...                                   scheme="dirichlet", alpha=0.3)
    >>> sim = tfl.federated.Simulation(lambda: tfl.models.build("mnist_cnn"), clients,
    ...                                algorithm="fedavg", clients_per_round=10, rounds=50)
    >>> history = sim.run()
"""

from __future__ import annotations

import importlib
from typing import Any

from tensorfleet.federated.aggregators import AGGREGATORS, build_aggregator
from tensorfleet.federated.algorithms import ALGORITHMS, OPTIMIZERS, build_process
from tensorfleet.federated.clients.partition import PARTITIONERS, Scheme, parse_scheme, partition, partition_indices

__all__ = [
    "AGGREGATORS", "ALGORITHMS", "OPTIMIZERS", "PARTITIONERS", "Scheme", "Simulation", "History",
    "ArrayClientData", "build_aggregator", "build_process", "epsilon", "load_history", "parse_scheme",
    "partition", "partition_indices", "plot_history", "plot_label_distribution", "summarize",
    "LazyClientData", "digits_clients", "emnist_like_clients",
]

_LAZY = {
    "Simulation": "tensorfleet.federated.simulation",
    "History": "tensorfleet.federated.simulation",
    "load_history": "tensorfleet.federated.simulation",
    "plot_history": "tensorfleet.federated.simulation",
    "ArrayClientData": "tensorfleet.federated.clients.clientdata",
    "summarize": "tensorfleet.federated.clients.clientdata",
    "plot_label_distribution": "tensorfleet.federated.clients.clientdata",
    "epsilon": "tensorfleet.federated.aggregators.dp",
    "LazyClientData": "tensorfleet.federated.clients.lazy",
    "digits_clients": "tensorfleet.federated.clients.lazy",
    "emnist_like_clients": "tensorfleet.federated.clients.lazy",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tensorfleet.federated' has no attribute {name!r}")
