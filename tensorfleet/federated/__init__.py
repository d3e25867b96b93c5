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
    >>> split = tfl.models.load_digits()
    >>> clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=100,
    ...                                   scheme="dirichlet", alpha=0.3)
    >>> sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_cnn"), clients,
    ...                                algorithm="fedavg", clients_per_round=10, rounds=50)
    >>> history = sim.run()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    # Extension points (docs/how-to-add-an-aggregator-or-algorithm.md): the parts a new one is made of.
    "Aggregate": "aggregators.parts",
    "Aggregator": "aggregators.parts",
    "AggregatorPart": "aggregators.parts",
    "AggregationError": "aggregators.parts",
    "Algorithm": "algorithms",
    "OptimizerSpec": "algorithms",
    "LocalSteps": "algorithms.client_work",
    "SecureAggregator": "secure",
    "Dropouts": "secure",
    # Rounds spread over worker processes: TFF's (Worker), TensorFlow's (TfWorker), their addresses on Kubernetes.
    "Worker": "backends.worker",
    "TfWorker": "backends.compiled.workers",
    "worker_addresses": "backends.k8s",
    "DamagedCheckpointError": "checkpoint",
})

if TYPE_CHECKING:  # what the lazy map above serves, for editors and type checkers (not run)
    from tensorfleet.federated.aggregators.dp import epsilon
    from tensorfleet.federated.aggregators.parts import Aggregate, AggregationError, Aggregator, AggregatorPart
    from tensorfleet.federated.algorithms import Algorithm, OptimizerSpec
    from tensorfleet.federated.algorithms.client_work import LocalSteps
    from tensorfleet.federated.backends.compiled.workers import TfWorker
    from tensorfleet.federated.backends.k8s import worker_addresses
    from tensorfleet.federated.backends.threads import configure_threads
    from tensorfleet.federated.backends.worker import Worker
    from tensorfleet.federated.checkpoint import DamagedCheckpointError
    from tensorfleet.federated.clients.base import ClientData
    from tensorfleet.federated.clients.clientdata import ArrayClientData, plot_label_distribution, summarize
    from tensorfleet.federated.clients.lazy import LazyClientData, digits_clients, emnist_like_clients
    from tensorfleet.federated.clients.xy import xy_clients
    from tensorfleet.federated.config import SimulationConfig
    from tensorfleet.federated.history import History, load_history, plot_history
    from tensorfleet.federated.secure import Dropouts, SecureAggregator
    from tensorfleet.federated.simulation import Simulation

__all__ = [
    "AGGREGATORS", "ALGORITHMS", "OPTIMIZERS", "PARTITIONERS", "Scheme", "build_aggregator", "build_process",
    "parse_scheme", "partition", "partition_indices", *_LAZY_NAMES,
]
