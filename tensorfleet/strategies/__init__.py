"""How one Keras model trains on many devices or machines.

Data parallelism through TensorFlow's distribution strategies, chosen by name from one
registry; cluster specs and TF_CONFIG; logical devices for machines without accelerators.
"""

from __future__ import annotations

from tensorfleet.strategies.devices import (
    RuntimeAlreadyInitializedError,
    logical_device_names,
    simulate_devices,
)

__all__ = ["RuntimeAlreadyInitializedError", "logical_device_names", "simulate_devices"]
