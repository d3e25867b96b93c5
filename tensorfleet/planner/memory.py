"""Per-device memory of training a model: the memory estimator.

What one device holds while training (Rajbhandari et al., "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", SC 2020, for the model states):

* parameters, gradients and optimizer state -- per parameter, in bytes:

  ==============  ==========  =========  ======================================
  optimizer       float32     mixed      mixed = fp16 weights + fp16 gradients
  ==============  ==========  =========  + fp32 master weights + fp32 states
  sgd             4 + 4       2 + 2 + 4
  momentum        4 + 4 + 4   2 + 2 + 8
  adam            4 + 4 + 8   2 + 2 + 12 (the "16 bytes per parameter" rule)
  ==============  ==========  =========  ======================================

* activations kept for the backward pass: the output of every layer for every example of
  the device's (micro-)batch, at the compute precision (4 bytes, or 2 under mixed precision).

Parallelism divides these: data parallelism splits the batch; tensor parallelism shards
every weight and activation over T devices (Megatron-LM); a pipeline splits the layers into
P stages, each holding its stage's weights and, with the 1F1B schedule (PipeDream-Flush),
the activations of at most P micro-batches in flight (GPipe keeps all of them); hybrid
combines the three. ZeRO (``zero`` 1 to 3) shards over the N data-parallel replicas the optimizer
state (stage 1), also the gradients (2), also the parameters (3): mixed-precision Adam keeps
4 + 12/N, 2 + 14/N and 16/N bytes per parameter (:func:`zero_bytes_per_parameter`).

The memory savers that change these figures (gradient accumulation, mixed precision,
recomputation) wrap training under any strategy: :mod:`tensorfleet.strategies.memory_savers`.

Example:
    >>> import tensorfleet as tfl
    >>> from tensorfleet.planner import memory
    >>> model = tfl.models.build("digits_cnn", keras="tf_keras")  # the memory model reads Keras 2 models
    >>> est = memory.estimate(model, batch_size=64, optimizer="adam")
    >>> est.parameters == model.count_params() * 4
    True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Sequence

from tensorfleet.compat.keras import keras2, require_keras2
from tensorfleet.strategies.memory_savers import Precision
from tensorfleet.validation import choice, integer, positive_int

__all__ = [
    "LayerMemory", "MemoryEstimate", "Optimizer", "Parallelism", "PipelineSchedule", "activation_values",
    "bytes_per_parameter", "estimate", "estimate_from_counts", "format_bytes", "layer_table", "plot_layers",
    "split_stages", "value_bytes", "zero_bytes_per_parameter",
]


class Optimizer(str, Enum):
    """Optimizers by the state they keep per parameter."""

    SGD = "sgd"
    MOMENTUM = "momentum"
    ADAM = "adam"


class Parallelism(str, Enum):
    DATA = "data"
    TENSOR = "tensor"
    PIPELINE = "pipeline"
    HYBRID = "hybrid"


class PipelineSchedule(str, Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"


_STATES = {Optimizer.SGD: 0, Optimizer.MOMENTUM: 1, Optimizer.ADAM: 2}


def _optimizer_kind(optimizer: Any) -> Optimizer:
    """An :class:`Optimizer` from a name or a Keras optimizer instance."""
    if isinstance(optimizer, (str, Optimizer)):
        return choice(Optimizer, "optimizer", optimizer)
    name = type(optimizer).__name__.lower()
    if name == "lossscaleoptimizer":
        return _optimizer_kind(optimizer.inner_optimizer)
    if name.startswith("adam"):
        return Optimizer.ADAM
    if name == "sgd":
        # Keras 2.14's SGD allocates a momentum slot per weight even with momentum=0.
        return Optimizer.MOMENTUM
    raise ValueError(f"optimizer must be 'sgd', 'momentum', 'adam' or one of those Keras optimizers. "
                     f"Received: {type(optimizer).__name__}")


def bytes_per_parameter(optimizer: str | Optimizer = "adam", precision: str | Precision = "float32") -> dict[str, int]:
    """Bytes per parameter of weights, gradients and optimizer state (ZeRO's accounting).

    Example:
        >>> bytes_per_parameter("adam", "mixed_float16")
        {'parameters': 2, 'gradients': 2, 'optimizer_state': 12}
    """
    opt = _optimizer_kind(optimizer)
    prec = choice(Precision, "precision", precision)
    states = _STATES[opt]
    if prec is Precision.FLOAT32:
        return {"parameters": 4, "gradients": 4, "optimizer_state": 4 * states}
    return {"parameters": 2, "gradients": 2, "optimizer_state": 4 + 4 * states}


_ZERO_SHARDS = ("optimizer_state", "gradients", "parameters")  # what stages 1, 2 and 3 add to the shards


def zero_bytes_per_parameter(optimizer: Any = "adam", precision: str | Precision = "float32", *, zero: int = 0,
                             replicas: int = 1) -> dict[str, float]:
    """Bytes per parameter on one of ``replicas`` data-parallel devices under ZeRO stage ``zero``.

    Example:
        >>> zero_bytes_per_parameter("adam", "mixed_float16", zero=1, replicas=4)
        {'parameters': 2.0, 'gradients': 2.0, 'optimizer_state': 3.0}
        >>> sum(zero_bytes_per_parameter("adam", zero=2, replicas=4).values())  # fp32: 4 + (4 + 8) / 4
        7.0
    """
    stage = integer("zero", zero, minimum=0, maximum=3)
    replicas = positive_int("replicas", replicas)
    return {k: v / replicas if k in _ZERO_SHARDS[:stage] else float(v)
            for k, v in bytes_per_parameter(optimizer, precision).items()}


def value_bytes(precision: str | Precision = "float32") -> int:
    """Bytes of one activation value at the compute precision: 4, or 2 under mixed precision.

    Example:
        >>> value_bytes("float32"), value_bytes("mixed_bfloat16")
        (4, 2)
    """
    return 4 if choice(Precision, "precision", precision) is Precision.FLOAT32 else 2


@dataclass(frozen=True)
class LayerMemory:
    """One layer: its parameter count and the values it outputs per example."""

    name: str
    kind: str
    parameters: int
    trainable: int
    activation_values: int


def _values_per_example(shape: Any) -> int:
    import tensorflow as tf

    shapes = tf.nest.flatten(shape, expand_composites=False) if isinstance(shape, list) else [shape]
    total = 0
    for s in shapes:
        dims = list(s)[1:]
        if any(d is None for d in dims):
            raise ValueError(f"Layer output shape {tuple(s)} has an unknown dimension; build the model "
                             "with a fully known input shape.")
        total += math.prod(int(d) for d in dims)
    return total


def layer_table(model: Any) -> list[LayerMemory]:
    """Per-layer parameter counts and per-example output sizes of a built Keras model.

    Parameter counts include non-trainable weights, so they sum to ``model.count_params()``.

    Example:
        >>> import tensorfleet as tfl
        >>> model = tfl.models.build("digits_mlp", keras="tf_keras")  # the memory model reads Keras 2 models
        >>> table = layer_table(model)
        >>> [(row.name, row.parameters) for row in table][-1]
        ('logits', 650)
        >>> sum(row.parameters for row in table) == model.count_params()
        True
    """

    require_keras2(model, "the planner's memory model")
    if not model.built:
        raise ValueError(f"Model {model.name!r} is not built; call it on data or give it an input shape first.")
    rows = []
    for layer in model.layers:
        params = sum(int(math.prod(w.shape)) for w in layer.weights)
        trainable = sum(int(math.prod(w.shape)) for w in layer.trainable_weights)
        shape = layer.output_shape if not isinstance(layer, keras2().layers.InputLayer) else layer.output_shape
        shape = shape[0] if isinstance(shape, list) and len(shape) == 1 else shape
        rows.append(LayerMemory(name=layer.name, kind=type(layer).__name__, parameters=params,
                                trainable=trainable, activation_values=_values_per_example(shape)))
    return rows


def activation_values(model: Any, *, include_input: bool = True) -> int:
    """Values per example that the forward pass produces (every layer's output)."""
    return sum(row.activation_values for row in layer_table(model)
               if include_input or row.kind != "InputLayer")


def split_stages(weights: Sequence[float], stages: int) -> list[list[int]]:
    """Splits layers (by index) into ``stages`` contiguous groups minimising the heaviest group.

    The pipeline's balanced partition (:func:`tensorfleet.model_parallel.partition.partition_layers`), on layer indices.

    Example:
        >>> split_stages([1, 1, 1, 5, 1, 1], 3)
        [[0, 1, 2], [3], [4, 5]]
    """
    from tensorfleet.model_parallel.partition import partition_layers

    positive_int("stages", stages)
    return partition_layers(list(range(len(weights))), stages, weights=list(weights))


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device (the fullest one) holds while training."""

    parameters: float
    gradients: float
    optimizer_state: float
    activations: float
    parallelism: str
    devices: int
    micro_batch: float

    @property
    def model_states(self) -> float:
        return self.parameters + self.gradients + self.optimizer_state

    @property
    def total(self) -> float:
        return self.model_states + self.activations

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "model_states": self.model_states, "total": self.total}


def _layout(parallelism: Parallelism, devices: int, tensor: int, pipeline: int) -> tuple[int, int, int]:
    """(data, tensor, pipeline) degrees."""
    if parallelism is Parallelism.DATA:
        return devices, 1, 1
    if parallelism is Parallelism.TENSOR:
        return 1, devices, 1
    if parallelism is Parallelism.PIPELINE:
        return 1, 1, devices
    if devices % (tensor * pipeline):
        raise ValueError(
            f"Hybrid parallelism needs devices divisible by tensor x pipeline. Received: devices={devices}, "
            f"tensor={tensor}, pipeline={pipeline}"
        )
    return devices // (tensor * pipeline), tensor, pipeline


def estimate_from_counts(
    *,
    stage_parameters: Sequence[float],
    stage_activation_values: Sequence[float],
    batch_size: int,
    optimizer: str | Optimizer = "adam",
    precision: str | Precision = "float32",
    parallelism: str | Parallelism = "data",
    devices: int = 1,
    tensor: int = 1,
    micro_batches: int = 1,
    schedule: str | PipelineSchedule = "1f1b",
    stage_trainable: Sequence[float] | None = None,
    zero: int = 0,
) -> MemoryEstimate:
    """Per-device memory from parameter and activation counts of the pipeline stages.

    Args:
        stage_parameters: parameters of each pipeline stage (one entry when not pipelined).
        stage_activation_values: activation values per example of each stage.
        batch_size: the global batch.
        optimizer, precision: see :func:`bytes_per_parameter`.
        parallelism: ``data``, ``tensor``, ``pipeline`` or ``hybrid``.
        devices: devices in all.
        tensor: tensor-parallel degree (hybrid only; tensor parallelism uses all devices).
        micro_batches: pipeline micro-batches per batch.
        schedule: ``1f1b`` (at most P micro-batches in flight per stage) or ``gpipe`` (all).
        stage_trainable: trainable parameters of each stage, which alone have gradients and
            optimizer state (default: all of them).
        zero: ZeRO stage 0-3 over the data-parallel replicas (:func:`zero_bytes_per_parameter`).

    Returns:
        The :class:`MemoryEstimate` of the fullest device.

    Example:
        >>> est = estimate_from_counts(stage_parameters=[1.5e9], stage_activation_values=[0],
        ...                            batch_size=8, precision="mixed_float16")
        >>> est.model_states / 1.5e9
        16.0
    """
    batch_size = positive_int("batch_size", batch_size)
    devices = positive_int("devices", devices)
    tensor = positive_int("tensor", tensor)
    micro_batches = positive_int("micro_batches", micro_batches)
    par = choice(Parallelism, "parallelism", parallelism)
    sched = choice(PipelineSchedule, "schedule", schedule)
    if len(stage_parameters) != len(stage_activation_values) or not stage_parameters:
        raise ValueError("stage_parameters and stage_activation_values must be non-empty and of equal length. "
                         f"Received lengths {len(stage_parameters)} and {len(stage_activation_values)}")
    pipeline = len(stage_parameters)
    if par in (Parallelism.DATA, Parallelism.TENSOR) and pipeline != 1:
        raise ValueError(f"{par.value} parallelism takes a single stage. Received: {pipeline} stages")
    if par is Parallelism.PIPELINE and pipeline != devices:
        raise ValueError(f"Pipeline parallelism needs one stage per device. Received: {pipeline} stages, "
                         f"devices={devices}")
    data, tp, pp = _layout(par, devices, tensor, pipeline)
    if batch_size % data:
        raise ValueError(f"batch_size must be divisible by the data-parallel degree {data}. Received: "
                         f"batch_size={batch_size}")
    per_replica = batch_size // data
    if pp > 1 and per_replica % micro_batches:
        raise ValueError(f"The per-replica batch {per_replica} must be divisible by micro_batches. Received: "
                         f"micro_batches={micro_batches}")
    micro = per_replica / micro_batches if pp > 1 else per_replica
    per_param = zero_bytes_per_parameter(optimizer, precision, zero=zero, replicas=data)
    act_bytes = value_bytes(precision)
    worst = None
    trainables = list(stage_parameters) if stage_trainable is None else list(stage_trainable)
    if len(trainables) != pipeline:
        raise ValueError(f"stage_trainable must have one entry per stage. Received: {len(trainables)} for "
                         f"{pipeline} stages")
    for stage, (params, trainable, acts) in enumerate(zip(stage_parameters, trainables, stage_activation_values)):
        in_flight = 1 if pp == 1 else (micro_batches if sched is PipelineSchedule.GPIPE
                                       else min(pp - stage, micro_batches))
        candidate = MemoryEstimate(
            parameters=params * per_param["parameters"] / tp,
            gradients=trainable * per_param["gradients"] / tp,
            optimizer_state=trainable * per_param["optimizer_state"] / tp,
            activations=acts * micro * in_flight * act_bytes / tp,
            parallelism=par.value,
            devices=devices,
            micro_batch=micro,
        )
        if worst is None or candidate.total > worst.total:
            worst = candidate
    assert worst is not None
    return worst


def estimate(
    model: Any,
    *,
    batch_size: int,
    optimizer: Any = "adam",
    precision: str | Precision = "float32",
    parallelism: str | Parallelism = "data",
    devices: int = 1,
    tensor: int = 1,
    pipeline: int = 1,
    micro_batches: int = 1,
    schedule: str | PipelineSchedule = "1f1b",
    zero: int = 0,
) -> MemoryEstimate:
    """Per-device training memory of a built Keras model under a parallelism.

    Pipeline stages are contiguous groups of the model's layers, balanced by parameters.

    Args:
        model: a built ``tf.keras.Model``.
        batch_size: the global batch size.
        optimizer: ``sgd``, ``momentum``, ``adam`` or a Keras optimizer instance.
        precision: ``float32``, ``mixed_float16`` or ``mixed_bfloat16``.
        parallelism: ``data``, ``tensor``, ``pipeline`` or ``hybrid``.
        devices: devices in all.
        tensor: tensor-parallel degree (hybrid).
        pipeline: pipeline stages (hybrid; pipeline parallelism uses one per device).
        micro_batches: pipeline micro-batches.
        schedule: ``1f1b`` or ``gpipe``.
        zero: ZeRO stage 0-3 over the data-parallel replicas (:func:`zero_bytes_per_parameter`).

    Returns:
        A :class:`MemoryEstimate` (bytes) for the fullest device.

    Example:
        >>> import tensorfleet as tfl
        >>> model = tfl.models.build("digits_mlp", keras="tf_keras")  # the memory model reads Keras 2 models
        >>> est = estimate(model, batch_size=64, precision="mixed_float16", parallelism="data", devices=4)
        >>> est.micro_batch
        16
        >>> est.model_states == 16 * model.count_params()  # fp32 master + fp16 copy + grads + Adam
        True
    """
    par = choice(Parallelism, "parallelism", parallelism)
    stages = {Parallelism.PIPELINE: devices, Parallelism.HYBRID: pipeline}.get(par, 1)
    stages = positive_int("pipeline", stages)
    table = layer_table(model)
    groups = split_stages([max(row.parameters, 1e-9) for row in table], stages)
    return estimate_from_counts(
        stage_parameters=[sum(table[i].parameters for i in g) for g in groups],
        stage_activation_values=[sum(table[i].activation_values for i in g) for g in groups],
        stage_trainable=[sum(table[i].trainable for i in g) for g in groups],
        batch_size=batch_size, optimizer=optimizer, precision=precision, parallelism=par,
        devices=devices, tensor=tensor, micro_batches=micro_batches, schedule=schedule, zero=zero,
    )


def format_bytes(n: float) -> str:
    """``1.50 GB`` style (decimal units).

    Example:
        >>> format_bytes(24e9)
        '24.00 GB'
    """
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def plot_layers(model: Any, path: str, *, batch_size: int, optimizer: Any = "adam",
                precision: str | Precision = "float32") -> str:
    """Writes a PNG bar chart of each layer's model-state and activation bytes.

    Example:
        >>> import tensorfleet as tfl
        >>> plot_layers(tfl.models.build("digits_mlp", keras="tf_keras"), "out/memory.png", batch_size=64)
        'out/memory.png'
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tensorfleet.io import save_figure

    positive_int("batch_size", batch_size)
    table = layer_table(model)
    per_param = sum(bytes_per_parameter(optimizer, precision).values())
    act_bytes = value_bytes(precision)
    names = [row.name for row in table]
    per_weight = bytes_per_parameter(optimizer, precision)["parameters"]
    states = [row.parameters * per_weight + row.trainable * (per_param - per_weight) for row in table]
    acts = [row.activation_values * batch_size * act_bytes for row in table]
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(names)), 4))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], states, width=0.4, label="parameters + gradients + optimizer state")
    ax.bar([x + 0.2 for x in xs], acts, width=0.4, label=f"activations (batch {batch_size})")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_ylabel("bytes")
    ax.set_title(f"{model.name}: memory per layer ({_optimizer_kind(optimizer).value}, "
                 f"{choice(Precision, 'precision', precision).value})")
    ax.legend()
    save_figure(fig, path)
    return str(path)
