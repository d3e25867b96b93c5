"""What every mesh backend shares: the batches, the step loop with its progress bar, the record.

Every backend trains with plain SGD on the mean softmax cross-entropy of integer labels, over the
same full batches in order (:func:`training_batches`), one step at a time under one progress bar
that also times each step (:func:`run_steps`), and reports a :class:`MeshHistory`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable

from tensorfleet.validation import number, positive_int

__all__ = ["MeshHistory", "count_devices", "run_steps", "training_batches"]


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
        """The history of ``epochs`` epochs from what :func:`run_steps` returned: (losses, seconds)."""
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


def run_steps(step: Callable[[Any, Any], float], batches: list, *, epochs: int, verbose: bool,
              desc: str) -> tuple[list[float], list[float]]:
    """Runs ``step(x_batch, y_batch) -> loss`` over every batch of every epoch under a progress
    bar; returns each step's loss and wall time in seconds."""
    from tqdm.auto import tqdm

    losses: list[float] = []
    seconds: list[float] = []
    with tqdm(total=epochs * len(batches), desc=desc, disable=not verbose, leave=False) as bar:
        last = time.perf_counter()
        for _ in range(epochs):
            for xb, yb in batches:
                losses.append(float(step(xb, yb)))
                now = time.perf_counter()
                seconds.append(now - last)
                last = now
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
    return losses, seconds


def count_devices(names: Iterable[str]) -> dict[str, int]:
    """How often each device occurs in ``names``, by its short name (``/device:CPU:1``), sorted."""
    import tensorflow as tf

    counts: dict[str, int] = {}
    for name in names:
        spec = tf.DeviceSpec.from_string(name)
        key = f"/device:{spec.device_type}:{spec.device_index}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
