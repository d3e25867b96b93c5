"""What every mesh backend shares: the checked arguments, the record.

``Mesh.fit`` trains with plain SGD on the mean softmax cross-entropy of integer labels, over the
full batches of :func:`training_batches`, one backend step per batch of Keras' own ``fit``
(:class:`~.step_trainer.StepTrainer`), and reports a :class:`MeshHistory`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from tensorfleet.validation import number, positive_int

__all__ = ["MeshHistory", "count_devices", "training_batches"]


@dataclasses.dataclass
class MeshHistory:
    """What :meth:`Mesh.fit <tensorfleet.model_parallel.mesh.Mesh.fit>` returns: per-epoch mean loss
    and every step's loss."""

    loss: list[float]
    step_loss: list[float]
    backend: str
    devices: list[str]
    placement: dict[str, int] = dataclasses.field(default_factory=dict)
    """Per device: graph ops placed there (mtf: the lowered graph; keras: the traced training
    step, backward pass included) or weight elements held there (dtensor)."""
    grid: list[list[str]] = dataclasses.field(default_factory=list)
    """keras backend: the devices as [data replica][model shard]; each replica computes on its row."""
    weights: dict[str, Any] = dataclasses.field(default_factory=dict)
    """:meth:`Mesh.fit_mtf`: the trained value of every Mesh-TF variable, by name."""
    step_seconds: list[float] = dataclasses.field(default_factory=list)
    """Wall time of each training step (the first includes tracing or session warm-up)."""

    @classmethod
    def from_steps(cls, run: tuple[list[float], list[float]], *, epochs: int, backend: str, devices: list[str],
                   **recorded: Any) -> "MeshHistory":
        """The history of ``epochs`` epochs from each step's (losses, seconds)."""
        step_loss, seconds = run
        per_epoch = len(step_loss) // epochs
        loss = [sum(step_loss[e * per_epoch:(e + 1) * per_epoch]) / per_epoch for e in range(epochs)]
        return cls(loss=loss, step_loss=step_loss, backend=backend, devices=devices, step_seconds=seconds, **recorded)


def training_batches(x: Any, y: Any, epochs: int, batch_size: int, learning_rate: float) -> tuple[Any, Any, list]:
    """Validates the training arguments; returns x, y as arrays and the full batches in order.

    A last batch smaller than ``batch_size`` is dropped (Mesh-TF graphs have a fixed batch
    dimension).
    """
    import numpy as np

    positive_int("epochs", epochs)
    positive_int("batch_size", batch_size)
    number("learning_rate", learning_rate, above=0)
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.int32)
    if len(x) != len(y):
        raise ValueError(f"x and y must hold the same number of examples. Received: {len(x)} and {len(y)}")
    if len(x) < batch_size:
        raise ValueError(f"batch_size must be at most the number of examples ({len(x)}). "
                         f"Received: batch_size={batch_size}")
    batches = [(x[s:s + batch_size], y[s:s + batch_size]) for s in range(0, len(x) - batch_size + 1, batch_size)]
    return x, y, batches


def count_devices(names: Iterable[str]) -> dict[str, int]:
    """How often each device occurs in ``names``, by its short name (``/device:CPU:1``), sorted."""
    import tensorflow as tf

    counts: dict[str, int] = {}
    for name in names:
        spec = tf.DeviceSpec.from_string(name)
        key = f"/device:{spec.device_type}:{spec.device_index}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
