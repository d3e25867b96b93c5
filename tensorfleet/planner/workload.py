"""What the planner knows about a model: its parameters, activations, traffic and FLOPs per example.

A registered Keras model gives them from its real layers (:func:`workload_from_model`); a
transformer given only by its parameter count gets a GPT-3-like shape (``12 L h^2 = N``,
``h = 128 L``, 128-wide heads) unless layers and hidden size are given, and activations after
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022):
``s h (34 + 5 a s / h)`` bytes per layer and example at 16 bits.

Example:
    >>> from tensorfleet.planner.workload import transformer_workload
    >>> w = transformer_workload(1.5e9)
    >>> w.name, len(w.layer_parameters)
    ('transformer-1.5B', 20)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tensorfleet.planner.memory import layer_table
from tensorfleet.validation import integer, number, positive_int

__all__ = ["Workload", "format_count", "transformer_workload", "workload_from_model"]


@dataclass(frozen=True)
class Workload:
    """What the planner needs to know about a model, per example."""

    name: str
    parameters: float
    layer_parameters: tuple[float, ...]
    layer_activations: tuple[float, ...]
    tensor_comm_values: float
    boundary_values: float
    flops_per_example: float
    checkpoint_activations: tuple[float, ...] | None = None

    @property
    def activation_values(self) -> float:
        return sum(self.layer_activations)


def transformer_workload(parameters: float, *, layers: int | None = None, hidden: int | None = None,
                         seq_len: int = 1024, name: str | None = None) -> Workload:
    """A decoder-only transformer of ``parameters`` weights (embeddings not counted separately).

    Example:
        >>> w = transformer_workload(175e9, layers=96, hidden=12288, seq_len=2048)
        >>> round(w.parameters / 1e9)
        175
    """
    number("parameters", parameters, above=0)
    layers = integer("layers", layers, minimum=1, optional=True)
    hidden = integer("hidden", hidden, minimum=1, optional=True)
    seq_len = positive_int("seq_len", seq_len)
    if layers is None and hidden is None:
        layers = max(1, round((parameters / (12 * 128**2)) ** (1 / 3)))
    if hidden is None:
        hidden = max(1, round(math.sqrt(parameters / (12 * layers))))
    if layers is None:
        layers = max(1, round(parameters / (12 * hidden**2)))
    heads = max(1, hidden // 128)
    per_layer_acts = seq_len * (34 * hidden + 5 * heads * seq_len) / 2  # 16-bit bytes / 2 = values
    return Workload(
        name=name or f"transformer-{format_count(parameters)}",
        parameters=float(parameters),
        layer_parameters=tuple([parameters / layers] * layers),
        layer_activations=tuple([per_layer_acts] * layers),
        tensor_comm_values=4.0 * layers * seq_len * hidden,
        boundary_values=float(seq_len * hidden),
        flops_per_example=6.0 * parameters * seq_len,
        # Full recomputation keeps only each layer's input (s x h) and rebuilds one layer at a time.
        checkpoint_activations=tuple([float(seq_len * hidden)] * layers),
    )


def workload_from_model(name: str, **model_kwargs: Any) -> Workload:
    """The workload of a registered Keras model, from its real layers.

    Example:
        >>> workload_from_model("digits_cnn").parameters
        38282.0
    """
    from tensorfleet.models import build

    model = build(name, **model_kwargs)
    table = layer_table(model)
    with_weights = [row.activation_values for row in table if row.parameters]
    return Workload(
        name=name,
        parameters=float(model.count_params()),
        layer_parameters=tuple(float(r.parameters) for r in table),
        layer_activations=tuple(float(r.activation_values) for r in table),
        # Sharded layers' outputs are all-reduced once forward and once backward.
        tensor_comm_values=2.0 * sum(with_weights),
        boundary_values=float(max(r.activation_values for r in table)),
        flops_per_example=6.0 * model.count_params(),
    )


def format_count(n: float) -> str:
    """A count in the planner's words: ``1.5B``, ``38.282K``.

    Example:
        >>> format_count(1.5e9), format_count(38282)
        ('1.5B', '38.282K')
    """
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"
