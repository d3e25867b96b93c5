"""tensorfleet: distributed, federated and on-device TensorFlow from plain Keras.

Subpackages are imported lazily so that ``import tensorfleet`` stays cheap and touches
no device: ``tensorfleet.strategies``, ``tensorfleet.federated``, ``tensorfleet.edge``,
``tensorfleet.models``.

Example:
    >>> import tensorfleet as tfl
    >>> strategy = tfl.strategies.build("one_device")
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBPACKAGES = ("strategies", "federated", "edge", "models", "cli")

__all__ = ["__version__", *_SUBPACKAGES]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'tensorfleet' has no attribute {name!r}")
