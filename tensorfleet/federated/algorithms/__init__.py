"""Federated algorithms, one module per algorithm, in :data:`ALGORITHMS`.

Each entry is an :class:`~tensorfleet.federated.algorithms.base.Algorithm`: the module's
``build`` (the ``tff`` backend's process, on TFF's learning API) plus its default client and
server optimizers (name and learning rate) and hyperparameters, which the compiled backend runs
as well. :func:`resolve` checks a name and overrides without TFF; :func:`build_process` turns them
into a ``tff.learning.templates.LearningProcess`` (on the tff track).

Example:
    >>> from tensorfleet.federated import algorithms
    >>> algorithms.ALGORITHMS.names()
    ['fedavg', 'fedsgd', 'fedprox', 'fedavgm', 'fedadam', 'fedyogi', 'fedadagrad', 'fednova']
    >>> name, client, server, options = algorithms.resolve("FedProx", server_learning_rate=0.5)
    >>> name, client.name, server, options
    ('fedprox', 'sgd', OptimizerSpec(name='sgd', learning_rate=0.5, options={}), {'mu': 0.01})

On the tff track, a TFF learning process:
    >>> import tensorflow as tf
    >>> import tensorflow_federated as tff
    >>> def model_fn():
    ...     model = tf.keras.Sequential([tf.keras.layers.Dense(10, input_shape=(64,))])
    ...     return tff.learning.models.from_keras_model(
    ...         model, input_spec=(tf.TensorSpec([None, 64]), tf.TensorSpec([None], tf.int32)),
    ...         loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    >>> process = algorithms.build_process("fedadam", model_fn, server_learning_rate=0.01)
    >>> type(process).__name__
    'LearningProcess'
"""

from __future__ import annotations

from typing import Any, Callable

from tensorfleet.federated.algorithms import fedadagrad, fedadam, fedavg, fedavgm, fednova, fedprox, fedsgd, fedyogi
from tensorfleet.federated.algorithms.base import (
    OPTIMIZERS,
    Algorithm,
    OptimizerSpec,
    make_optimizer,
    make_tff_optimizer,
)
from tensorfleet.registry import Registry
from tensorfleet.validation import UnknownOptionError

__all__ = ["ALGORITHMS", "OPTIMIZERS", "Algorithm", "OptimizerSpec", "build_process", "catalogue", "make_optimizer",
           "make_tff_optimizer", "resolve"]

ALGORITHMS: Registry[Algorithm] = Registry("algorithm")

_SGD = OptimizerSpec("sgd", 0.1)
ALGORITHMS.register("fedavg", Algorithm(fedavg.build, _SGD, OptimizerSpec("sgd", 1.0),
                                        paper="McMahan et al., AISTATS 2017"),
                    aliases=("fed_avg",), description="Federated averaging, weighted by client examples.")
ALGORITHMS.register("fedsgd", Algorithm(fedsgd.build, None, OptimizerSpec("sgd", 0.5),
                                        paper="McMahan et al., AISTATS 2017", client_work=fedsgd.client_work),
                    aliases=("fed_sgd",), description="One full-batch gradient per client per round.")
ALGORITHMS.register("fedprox", Algorithm(fedprox.build, _SGD, OptimizerSpec("sgd", 1.0), {"mu": 0.01},
                                         paper="Li et al., MLSys 2020"),
                    aliases=("fed_prox",), description="FedAvg whose clients step on f_k(w) + mu/2 ||w - w_server||^2.")
ALGORITHMS.register("fedavgm", Algorithm(fedavgm.build, _SGD, OptimizerSpec("sgdm", 1.0, {"momentum": 0.9}),
                                         paper="Hsu et al., 2019"),
                    description="FedAvg with server momentum.")
ALGORITHMS.register("fedadam", Algorithm(fedadam.build, _SGD,
                                         OptimizerSpec("adam", 0.01, {"beta_1": 0.9, "beta_2": 0.99, "epsilon": 1e-3}),
                                         paper="Reddi et al., ICLR 2021"),
                    description="FedAvg with an Adam server optimizer.")
ALGORITHMS.register("fedyogi", Algorithm(fedyogi.build, _SGD,
                                         OptimizerSpec("yogi", 0.01, {"beta_1": 0.9, "beta_2": 0.99, "epsilon": 1e-3}),
                                         paper="Reddi et al., ICLR 2021"),
                    description="FedAvg with a Yogi server optimizer.")
ALGORITHMS.register("fedadagrad", Algorithm(fedadagrad.build, _SGD,
                                            OptimizerSpec("adagrad", 0.1, {"epsilon": 1e-3}),
                                            paper="Reddi et al., ICLR 2021"),
                    description="FedAvg with an Adagrad server optimizer.")
ALGORITHMS.register("fednova", Algorithm(None, _SGD, OptimizerSpec("sgd", 1.0), paper="Wang et al., NeurIPS 2020",
                                         client_work=fednova.client_work),
                    description="Normalized averaging: updates over local steps, rescaled by their weighted mean.")


def resolve(name: str, *, client_optimizer: str | None = None, client_learning_rate: float | None = None,
            server_optimizer: str | None = None, server_learning_rate: float | None = None,
            **hyperparameters: Any) -> tuple[str, OptimizerSpec | None, OptimizerSpec, dict[str, Any]]:
    """The canonical name, the optimizer specs and hyperparameters after overrides (no TFF)."""
    canonical = ALGORITHMS.canonical(name)
    algo = ALGORITHMS.get(canonical)
    unknown = sorted(set(hyperparameters) - set(algo.hyperparameters))
    if unknown:
        allowed = ", ".join(algo.hyperparameters) or "none"
        raise UnknownOptionError(f"Algorithm {canonical!r} takes no option {unknown[0]!r} (its options: {allowed}). "
                        f"Received: {unknown[0]}={hyperparameters[unknown[0]]!r}")
    if client_optimizer is not None:
        OPTIMIZERS.canonical(client_optimizer)
    if server_optimizer is not None:
        OPTIMIZERS.canonical(server_optimizer)
    client = None
    if algo.client_optimizer is not None:
        client = algo.client_optimizer.with_overrides(client_optimizer, client_learning_rate)
    server = algo.server_optimizer.with_overrides(server_optimizer, server_learning_rate)
    return canonical, client, server, {**algo.hyperparameters, **hyperparameters}


def build_process(name: str, model_fn: Callable[[], Any], *, aggregator: Any = None,
                  client_optimizer: str | None = None, client_learning_rate: float | None = None,
                  server_optimizer: str | None = None, server_learning_rate: float | None = None,
                  **hyperparameters: Any) -> Any:
    """Builds the ``tff.learning.templates.LearningProcess`` of algorithm ``name``.

    Args:
        name: a registered algorithm (``fedavg``, ``fedsgd``, ``fedprox``, ``fedavgm``,
            ``fedadam``, ``fedyogi``, ``fedadagrad``).
        model_fn: no-argument callable returning a ``tff.learning.models.VariableModel``.
        aggregator: a ``tff.aggregators`` factory for the model update, or None for the mean.
        client_optimizer, client_learning_rate, server_optimizer, server_learning_rate: override
            the algorithm's defaults (optimizer names from :data:`OPTIMIZERS`).
        **hyperparameters: algorithm options such as ``mu`` for ``fedprox``.

    Example (one round of FedProx on two clients of ten examples, on a worker this process owns):
        >>> import numpy as np
        >>> import tensorflow as tf
        >>> import tensorflow_federated as tff
        >>> from tensorfleet.federated.backends.tff import managed_context
        >>> def model_fn():
        ...     model = tf.keras.Sequential([tf.keras.layers.Dense(10, input_shape=(64,))])
        ...     return tff.learning.models.from_keras_model(
        ...         model, input_spec=(tf.TensorSpec([None, 64]), tf.TensorSpec([None], tf.int32)),
        ...         loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> process = build_process("fedprox", model_fn, mu=0.1)
        >>> x, y = np.ones((10, 64), np.float32), np.arange(10, dtype=np.int32)
        >>> client_data = [tf.data.Dataset.from_tensor_slices((x, y)).batch(5)] * 2
        >>> with managed_context():
        ...     out = process.next(process.initialize(), client_data)
        >>> int(out.metrics["client_work"]["train"]["num_examples"])
        20
    """
    canonical, client, server, hyper = resolve(
        name, client_optimizer=client_optimizer, client_learning_rate=client_learning_rate,
        server_optimizer=server_optimizer, server_learning_rate=server_learning_rate, **hyperparameters)
    algo = ALGORITHMS.get(canonical)
    if algo.build is None:
        raise ValueError(f"Algorithm {canonical!r} runs on the compiled backend only (TFF has no {canonical}). "
                         f"Received: algorithm={name!r} on backend='tff'; use backend='compiled' or 'auto'.")
    return algo.build(model_fn, client_optimizer=None if client is None else make_tff_optimizer(client),
                      server_optimizer=make_tff_optimizer(server), aggregator=aggregator, **hyper)


def catalogue() -> list[dict[str, Any]]:
    """One row per algorithm: name, description, paper, defaults and backends (for the CLI)."""
    rows = []
    for entry in ALGORITHMS.entries():
        algo = entry.obj
        rows.append({
            "name": entry.name, "description": entry.description, "paper": algo.paper,
            "client_optimizer": None if algo.client_optimizer is None
            else f"{algo.client_optimizer.name}(lr={algo.client_optimizer.learning_rate:g})",
            "server_optimizer": f"{algo.server_optimizer.name}(lr={algo.server_optimizer.learning_rate:g})",
            "options": dict(algo.hyperparameters),
            "backends": ["compiled", "tff"] if algo.build is not None else ["compiled"],
        })
    return rows
