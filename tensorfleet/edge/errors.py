"""Errors of the edge pipeline. Each is a ``ValueError`` so the CLI reports it as bad input."""

from __future__ import annotations

__all__ = [
    "EdgeError",
    "InvalidModelError",
    "QuantizationError",
    "MicroIncompatibleError",
    "UnsupportedOpError",
    "ArenaTooSmallError",
    "DecompositionError",
    "EdgeWarning",
]


class EdgeWarning(UserWarning):
    """A result that is not what its request suggests, though valid (the CLI shows it as a ``warning:`` line)."""


class EdgeError(ValueError):
    """Base class of the errors tensorfleet.edge raises for a model or input it cannot use."""


class InvalidModelError(EdgeError):
    """Bytes that are not a TFLite flatbuffer (empty, truncated, another format)."""


class QuantizationError(EdgeError):
    """A converted model is not quantized the way its mode promises (e.g. float inputs in int8)."""


class MicroIncompatibleError(EdgeError):
    """A model TFLite Micro cannot run (hybrid dynamic-range ops, float16 weights, ...)."""


class UnsupportedOpError(MicroIncompatibleError):
    """The model uses operators that TFLite Micro has no kernel for; ``ops`` names them."""

    def __init__(self, message: str, ops: list[str]) -> None:
        super().__init__(message)
        self.ops = ops


class ArenaTooSmallError(EdgeError):
    """The tensor arena is smaller than the model needs; ``required`` is the smallest that works."""

    def __init__(self, message: str, required: int, received: int) -> None:
        super().__init__(message)
        self.required = required
        self.received = received


class DecompositionError(EdgeError):
    """A model or rank that :func:`tensorfleet.edge.decompose` cannot use (a rank above the layer's,
    a layer kind no method factors, a model with no layer to factor)."""
