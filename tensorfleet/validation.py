"""Checks of option values shared across tensorfleet, with Keras-style messages."""

from __future__ import annotations

from typing import Any

__all__ = ["positive_int"]


def positive_int(name: str, value: Any) -> int:
    """``value`` if it is an int > 0 (not a bool); else ``ValueError`` naming it.

    Example:
        >>> positive_int("num_clients", 0)
        Traceback (most recent call last):
        ValueError: num_clients must be a positive integer. Received: num_clients=0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")
    return value
