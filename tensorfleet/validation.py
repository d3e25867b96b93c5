"""Checks of option values shared across tensorfleet, with Keras-style messages."""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

__all__ = ["choice", "positive_int"]

E = TypeVar("E", bound=Enum)


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


def choice(enum: type[E], name: str, value: Any) -> E:
    """The member of the string enum ``enum`` that ``value`` names (case and surrounding spaces
    ignored), or ``value`` itself when it is a member; else ``ValueError`` listing the choices.

    Example:
        >>> from enum import Enum
        >>> class Mode(str, Enum):
        ...     RING = "ring"
        ...     TREE = "tree"
        >>> choice(Mode, "mode", " Ring ")
        <Mode.RING: 'ring'>
        >>> choice(Mode, "mode", "star")
        Traceback (most recent call last):
        ValueError: mode must be one of 'ring', 'tree'. Received: mode='star'
    """
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        wanted = value.strip().lower()
        for member in enum:
            if str(member.value).lower() == wanted:
                return member
    choices = ", ".join(repr(m.value) for m in enum)
    raise ValueError(f"{name} must be one of {choices}. Received: {name}={value!r}")
