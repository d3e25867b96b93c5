"""How one Keras model trains on many devices or machines.

Data parallelism through TensorFlow's distribution strategies, chosen by name from one
registry (``build``, ``available``, ``describe``, ``register``); cluster specs and
TF_CONFIG (:mod:`tensorfleet.strategies.tf_config`); the inputs ``model.fit`` needs under each
strategy (``fit_inputs``); logical devices for machines without accelerators
(``simulate_devices``); the task servers of a parameter-server cluster
(:mod:`~tensorfleet.strategies.servers`) and its ``staleness`` option
(:mod:`~tensorfleet.strategies.staleness`); the learning rate for the global batch
(``scaled_learning_rate``, :mod:`~tensorfleet.strategies.large_batch`) and LARS/LAMB (``lars``,
``lamb``, :mod:`~tensorfleet.strategies.layerwise`); local SGD, replicas that average their weights every H
steps (``LocalSGD``, :mod:`~tensorfleet.strategies.local_sgd`).

Example (a mirrored replica on each of the 4 logical CPUs of the test set-up):
    >>> import tensorflow as tf
    >>> import tensorfleet as tfl
    >>> data = tfl.models.load_digits()
    >>> x, y = data.x_train[:128], data.y_train[:128]
    >>> strategy = tfl.strategies.build("mirrored")
    >>> strategy.num_replicas_in_sync
    4
    >>> with strategy.scope():
    ...     model = tfl.models.build("digits_cnn")
    ...     model.compile(optimizer="adam", metrics=["accuracy"],
    ...                   loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    >>> history = model.fit(**tfl.strategies.fit_inputs(x, y, batch_size=64, strategy=model),
    ...                     epochs=1, verbose=0)
    >>> sorted(history.history)
    ['accuracy', 'loss']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorfleet.lazy import attach

# Registration order is the order `tensorfleet strategies list` shows: auto, the data-parallel
# strategies, tpu; the split keeps the import sorter from moving other imports in between.
from tensorfleet.strategies.auto import choose
from tensorfleet.strategies.data_parallel import CollectiveImplementation, CrossDeviceOps
from tensorfleet.strategies.tpu import NoTPUError

# isort: split
from tensorfleet.strategies.devices import RuntimeAlreadyInitializedError, logical_device_names, simulate_devices
from tensorfleet.strategies.inputs import FitInputs, evaluate_inputs, fit_inputs, uses_coordinator
from tensorfleet.strategies.registry import STRATEGIES, Availability, available, build, describe, info, register
from tensorfleet.strategies.servers import start_in_process_cluster, start_server
from tensorfleet.strategies.tf_config import ClusterSpec, Role, TFConfig, TFConfigError, parse_tf_config

# The memory savers, the parameter server's staleness option, the
# learning rate for the global batch and the layer-wise optimizers (LARS, LAMB), loaded on first use.
__getattr__, _lazy = attach(__name__, internal=("memory_savers", "staleness", "large_batch", "layerwise", "local_sgd"),
                            names={"scaled_learning_rate": "large_batch", "ScalingRule": "large_batch",
                                   "lars": "layerwise", "lamb": "layerwise", "LocalSGD": "local_sgd",
                                   "accumulate_gradients": "memory_savers", "mixed_precision": "memory_savers",
                                   "recompute": "memory_savers", "resolve_staleness": "staleness",
                                   "install_staleness": "staleness:install", "traffic": "compression"})

if TYPE_CHECKING:  # what the lazy map above serves, for editors and type checkers (not run)
    from tensorfleet.strategies.compression import traffic
    from tensorfleet.strategies.large_batch import ScalingRule, scaled_learning_rate
    from tensorfleet.strategies.layerwise import lamb, lars
    from tensorfleet.strategies.local_sgd import LocalSGD
    from tensorfleet.strategies.memory_savers import accumulate_gradients, mixed_precision, recompute
    from tensorfleet.strategies.staleness import install as install_staleness, resolve_staleness

__all__ = [
    "STRATEGIES",
    "Availability",
    "ClusterSpec",
    "CollectiveImplementation",
    "CrossDeviceOps",
    "FitInputs",
    "NoTPUError",
    "Role",
    "RuntimeAlreadyInitializedError",
    "TFConfig",
    "TFConfigError",
    "available",
    "build",
    "choose",
    "describe",
    "evaluate_inputs",
    "fit_inputs",
    "info",
    "logical_device_names",
    "parse_tf_config",
    "register",
    "simulate_devices",
    "start_in_process_cluster",
    "start_server",
    "uses_coordinator",
    *_lazy,
]
