"""How one Keras model trains on many devices or machines.

Data parallelism through TensorFlow's distribution strategies, chosen by name from one
registry (``build``, ``available``, ``describe``, ``register``); cluster specs and
TF_CONFIG (:mod:`tensorfleet.strategies.cluster`); the inputs ``model.fit`` needs under each
strategy (``fit_inputs``); logical devices for machines without accelerators
(``simulate_devices``).

Example:
    >>> import tensorfleet as tfl
    >>> strategy = tfl.strategies.build("mirrored")
    >>> with strategy.scope():
    ...     model = tfl.models.build("digits_cnn")
    ...     model.compile(optimizer="adam", loss=..., metrics=["accuracy"])
    >>> model.fit(**tfl.strategies.fit_inputs(x, y, batch_size=64), epochs=3)
"""

from __future__ import annotations

from tensorfleet.strategies import auto as _auto  # noqa: F401  (registers "auto")
from tensorfleet.strategies.auto import choose
from tensorfleet.strategies.cluster import ClusterSpec, Role, TFConfig, TFConfigError, parse_tf_config
from tensorfleet.strategies.data_parallel import (
    CollectiveImplementation,
    CrossDeviceOps,
    NoTPUError,
    start_in_process_cluster,
    start_server,
)
from tensorfleet.strategies.devices import (
    RuntimeAlreadyInitializedError,
    logical_device_names,
    simulate_devices,
)
from tensorfleet.strategies.inputs import FitInputs, evaluate_inputs, fit_inputs, uses_coordinator
from tensorfleet.strategies.registry import STRATEGIES, Availability, available, build, describe, info, register

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
]
