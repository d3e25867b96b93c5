"""Federated learning simulations: compiled in this process, or on tensorflow-federated (the tff track).

* :func:`partition` splits ``(x, y)`` into clients (``iid``, ``dirichlet``, ``shards``,
  ``quantity``) as tensorfleet's :class:`ClientData` (TFF's interface, without TFF); :func:`summarize`
  and :func:`plot_label_distribution` describe any client data, and :func:`xy_clients` shows how a
  Simulation reads TFF's own ClientData (element names mapped to ``x``/``y``, batches unbatched).
* :data:`ALGORITHMS` (fedavg, fedsgd, fedprox, fedavgm, fedadam, fedyogi, fedadagrad) and
  :data:`AGGREGATORS` (mean, DP, compression, median, trimmed mean, Krum) are registries.
* :class:`Simulation` runs the rounds as its :class:`SimulationConfig` says; :class:`History`
  holds its metrics (:func:`load_history`, :func:`plot_history`);
  :mod:`~tensorfleet.federated.backends` is where rounds run (by default compiled, which needs no
  TFF), and :mod:`~tensorfleet.federated.backends.tff` owns TFF's C++ worker process so that none
  outlives Python;
  :func:`configure_threads`, called first, sets TensorFlow's thread pools for the compiled backend's lanes.

TensorFlow and TFF are imported only when something needs them.

Example:
    >>> import tensorfleet as tfl
    >>> split = tfl.models.datasets.load_digits()
    >>> clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=100,
    ...                                   scheme="dirichlet", alpha=0.3)
    >>> sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_cnn"), clients,
    ...                                algorithm="fedavg", clients_per_round=10, rounds=50)
    >>> history = sim.run()
"""

from __future__ import annotations

from tensorfleet.federated.aggregators import AGGREGATORS, build_aggregator
from tensorfleet.federated.algorithms import ALGORITHMS, OPTIMIZERS, build_process
from tensorfleet.federated.clients.partition import PARTITIONERS, Scheme, parse_scheme, partition, partition_indices
from tensorfleet.lazy import attach

__getattr__, _LAZY_NAMES = attach(__name__, names={
    "Simulation": "simulation",
    "SimulationConfig": "config",
    "History": "history",
    "load_history": "history",
    "plot_history": "history",
    "ArrayClientData": "clients.clientdata",
    "ClientData": "clients.base",
    "summarize": "clients.clientdata",
    "plot_label_distribution": "clients.clientdata",
    "xy_clients": "clients.xy",
    "epsilon": "aggregators.dp",
    "configure_threads": "backends.threads",
    "LazyClientData": "clients.lazy",
    "digits_clients": "clients.lazy",
    "emnist_like_clients": "clients.lazy",
})

__all__ = [
    "AGGREGATORS", "ALGORITHMS", "OPTIMIZERS", "PARTITIONERS", "Scheme", "build_aggregator", "build_process",
    "parse_scheme", "partition", "partition_indices", *_LAZY_NAMES,
]
