"""Model states per device from the weights a layout actually splits.

:func:`tensorfleet.planner.memory.estimate` on its own assumes the Megatron-LM picture: tensor
parallelism splits every weight over the T tensor-parallel devices, and ZeRO (Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020) splits every
weight's states over the N data-parallel replicas. A real layout splits some weights and keeps
others whole (a Mesh-TF layout on DTensor keeps embedding tables and convolution kernels whole,
and a rule such as ``heads:m`` splits the attention weights only). Given, for each weight, its
parameter count, the number of parts its layout cuts it into, and how many more parts ZeRO's
batch-axis split cuts its states into, the model states one device holds are exact:

    bytes = sum over weights of  n x (b_param / p_param + b_grad / p_grad + b_state / p_state)

where each ``p`` is the weight's layout parts, times its ZeRO parts once the stage reaches that
state (stage 1: optimizer state; 2: also gradients; 3: also parameters). Frozen weights have no
gradients or optimizer state. :meth:`tensorfleet.model_parallel.mesh.Mesh.weight_splits` derives
the list from a mesh's own layout decisions.

Example:
    >>> weights = [WeightSplit(1000, parts=4, zero_parts=2), WeightSplit(200)]  # one split, one whole
    >>> split_fraction(weights)
    0.8333333333333334
    >>> model_state_bytes(weights, "adam", zero=0)
    {'parameters': 1800.0, 'gradients': 1800.0, 'optimizer_state': 3600.0}
    >>> model_state_bytes(weights, "adam", zero=1)["optimizer_state"]  # 8 x 1000 / (4 x 2) + 8 x 200 / 1
    2600.0
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from tensorfleet.compat.keras import is_keras3_model, require_keras2
from tensorfleet.model_parallel.partition import WeightSplit
from tensorfleet.planner.memory import (
    MemoryEstimate,
    Parallelism,
    bytes_per_parameter,
    estimate as memory_estimate,
    zero_bytes_per_parameter,
)
from tensorfleet.strategies.memory_savers import Precision
from tensorfleet.validation import integer

__all__ = ["WeightSplit", "estimate", "model_state_bytes", "split_fraction"]


def _checked(weights: Any) -> list[WeightSplit]:
    weights = list(weights) if isinstance(weights, (list, tuple)) else weights
    if not isinstance(weights, list) or not weights or not all(isinstance(w, WeightSplit) for w in weights):
        raise ValueError("weights must be a non-empty list of WeightSplit (one per weight of the model). "
                         f"Received: weights={weights!r}")
    return weights


def split_fraction(weights: Sequence[WeightSplit]) -> float:
    """The fraction of the parameters that the layout splits (``parts > 1``)."""
    weights = _checked(weights)
    total = sum(w.parameters for w in weights)
    return sum(w.parameters for w in weights if w.parts > 1) / total if total else 0.0


def model_state_bytes(weights: Sequence[WeightSplit], optimizer: Any = "adam",
                      precision: str | Precision = "float32", *, zero: int = 0) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state one device holds under ZeRO stage ``zero``.

    Example:
        >>> model_state_bytes([WeightSplit(100, zero_parts=4)], "adam", zero=3)
        {'parameters': 100.0, 'gradients': 100.0, 'optimizer_state': 200.0}
    """
    weights = _checked(weights)
    stage = integer("zero", zero, minimum=0, maximum=3)
    held = dict.fromkeys(bytes_per_parameter(optimizer, precision), 0.0)
    for w in weights:  # a frozen weight holds its parameters only, whole over the replicas
        per_parameter = zero_bytes_per_parameter(optimizer, precision, zero=stage if w.trainable else 0,
                                                 replicas=w.zero_parts)
        for kind, size in per_parameter.items():
            if kind == "parameters" or w.trainable:
                held[kind] += w.parameters * size / w.parts
    return held


def estimate(model: Any, weights: Sequence[WeightSplit], *, batch_size: int, zero: int = 0,
             **options: Any) -> MemoryEstimate:
    """:func:`tensorfleet.planner.memory.estimate` of ``model`` with its model states held as
    ``weights`` say (activations as there); ``options`` are that function's (not ``pipeline``).

    Raises:
        ValueError: ``weights`` that do not add up to the model's parameters, or a pipeline.

    Example:
        >>> import tensorfleet as tfl
        >>> model = tfl.models.build("digits_mlp", keras="tf_keras")  # the memory model reads Keras 2 models
        >>> whole = [WeightSplit(int(w.shape.num_elements())) for w in model.weights]
        >>> estimate(model, whole, batch_size=8).model_states == 16 * model.count_params()
        True
    """
    if is_keras3_model(model):
        require_keras2(model, "the planner's memory model")
    weights = _checked(weights)
    counted = sum(w.parameters for w in weights)
    if counted != model.count_params():
        raise ValueError(f"weights must describe the model's {model.count_params():,} parameters, one WeightSplit per "
                         f"weight. Received: weights holding {counted:,} parameters")
    if options.get("parallelism") in ("pipeline", Parallelism.PIPELINE) or options.get("pipeline", 1) != 1:
        raise ValueError("A list of weight splits describes one stage; use memory.estimate for pipelines. Received: "
                         f"parallelism={options.get('parallelism')!r}, pipeline={options.get('pipeline', 1)!r}")
    est = memory_estimate(model, batch_size=batch_size, zero=zero, **options)
    held = model_state_bytes(weights, options.get("optimizer", "adam"), options.get("precision", "float32"), zero=zero)
    return replace(est, parameters=held["parameters"], gradients=held["gradients"],
                   optimizer_state=held["optimizer_state"])
