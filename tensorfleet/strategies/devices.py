"""Logical CPU devices: stand-ins for accelerators on a machine without any.

TensorFlow can split one physical CPU into several logical devices, but only before its
runtime initialises (the first op, the first ``list_logical_devices`` call, the first
strategy). :func:`simulate_devices` does that split and refuses clearly when it is too late.
:func:`local_devices` and :func:`local_tpu_devices` are the devices strategies place replicas on.
"""

from __future__ import annotations

import logging
from typing import Any

from tensorfleet.validation import positive_int

__all__ = ["simulate_devices", "local_devices", "local_tpu_devices", "logical_device_names",
           "RuntimeAlreadyInitializedError"]

log = logging.getLogger(__name__)


class RuntimeAlreadyInitializedError(RuntimeError):
    """The TensorFlow runtime had started before the logical devices could be set."""


def simulate_devices(n: int, *, device_type: str = "CPU") -> list[str]:
    """Splits the first physical ``device_type`` into ``n`` logical devices.

    Must run before TensorFlow initialises its runtime. Calling it again with the same ``n``
    after that is a no-op that returns the same device names; any other ``n`` raises
    :class:`RuntimeAlreadyInitializedError`.

    Args:
        n: how many logical devices, at least 1.
        device_type: ``"CPU"`` (or ``"GPU"`` where one exists).

    Returns:
        The logical device names, e.g. ``["/device:CPU:0", "/device:CPU:1"]``.

    Example (first thing in the program; the test set-up has made this same call):
        >>> import tensorfleet as tfl
        >>> tfl.strategies.simulate_devices(4)
        ['/device:CPU:0', '/device:CPU:1', '/device:CPU:2', '/device:CPU:3']
        >>> tfl.strategies.simulate_devices(2)  # the runtime has started: another count is refused
        Traceback (most recent call last):
        ...
        tensorfleet.strategies.devices.RuntimeAlreadyInitializedError: simulate_devices(2) was called after
        TensorFlow initialised its runtime, which already has 4 logical CPU device(s): [...]. Call
        tensorfleet.strategies.simulate_devices() first thing in the program, ...
    """
    positive_int("n", n)
    if device_type not in ("CPU", "GPU"):
        raise ValueError(f"device_type must be 'CPU' or 'GPU'. Received: device_type={device_type!r}")
    import tensorflow as tf

    physical = tf.config.list_physical_devices(device_type)
    if not physical:
        raise ValueError(f"This machine has no physical {device_type} device to split.")
    try:
        tf.config.set_logical_device_configuration(
            physical[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
    except RuntimeError as exc:
        current = logical_device_names(device_type)
        if len(current) == n:
            return current
        raise RuntimeAlreadyInitializedError(
            f"simulate_devices({n}) was called after TensorFlow initialised its runtime, which "
            f"already has {len(current)} logical {device_type} device(s): {current}. Call "
            "tensorfleet.strategies.simulate_devices() first thing in the program, before any "
            "other TensorFlow call (building a model, a tensor or a strategy)."
        ) from exc
    names = logical_device_names(device_type)
    log.info("Split the %s into %d logical devices: %s", device_type, n, names)
    return names


def logical_device_names(device_type: str = "CPU") -> list[str]:
    """Names of the logical devices of ``device_type`` (initialises the runtime)."""
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices(device_type)]


def local_devices() -> list[Any]:
    """The logical devices that replicas go on by default: every GPU, else every CPU (initialises
    the runtime)."""
    import tensorflow as tf

    return tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")


def local_tpu_devices() -> list[str]:
    """Names of the TPU cores attached to this machine (initialises the runtime)."""
    return logical_device_names("TPU")
