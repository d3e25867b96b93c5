"""Pipeline model parallelism for Keras models: stages, micro-batches and schedules.

A model is cut into consecutive stages, each on its own device; a batch is cut into ``m``
micro-batches that flow through the stages, so that the devices work at the same time on
different micro-batches. Three schedules decide the order of each device's forward and
backward passes:

- ``gpipe``: all forward passes, then all backward passes (Huang et al., 2019). Each device
  holds the activations of all ``m`` micro-batches at its peak.
- ``1f1b``: after ``p - s - 1`` warm-up forwards, stage ``s`` alternates one forward and one
  backward (PipeDream-Flush, Narayanan et al., 2019 and 2021). Same bubble as GPipe, at most
  ``p`` micro-batches of activations held.
- ``interleaved``: each device holds ``v`` non-consecutive model chunks (virtual stages), which
  shrinks the bubble by ``v`` (Megatron-LM, Narayanan et al., 2021). Needs ``m`` to be a
  multiple of ``p``.

With equal per-stage cost the bubble fraction (idle share of device time) is
``(p - 1) / (m + p - 1)`` for GPipe and 1F1B and ``(p - 1) / (v m + p - 1)`` interleaved.

The modules, one concern each:

* :mod:`~tensorfleet.model_parallel.pipeline.schedules`: the orders, pure functions
  (:func:`schedule_orders`, :class:`Schedule`, :class:`ScheduledOp`, :class:`Pass`).
* :mod:`~tensorfleet.model_parallel.pipeline.timeline`: orders laid out in time
  (:func:`simulate`, :class:`TimelineEvent`), :func:`bubble_fraction`, :func:`theoretical_bubble`,
  :func:`peak_activations`, :func:`plot_schedule`.
* :mod:`~tensorfleet.model_parallel.pipeline.stages`: :func:`partition_layers`.
* :mod:`~tensorfleet.model_parallel.pipeline.runner`: :class:`Pipeline`, which runs the orders
  for real, one thread per device, and its :class:`StepResult`.
* :mod:`~tensorfleet.model_parallel.pipeline.keras_model`: the Keras front
  (:meth:`Pipeline.keras_model`).

Example:
    >>> import numpy as np
    >>> import tensorflow as tf
    >>> from tensorfleet.model_parallel.pipeline import Pipeline
    >>> model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu"),
    ...                              tf.keras.layers.Dense(10)])
    >>> model.build((None, 64))
    >>> pipe = Pipeline(model, num_stages=2, micro_batches=4, schedule="1f1b")
    >>> x = tf.random.stateless_uniform((8, 64), seed=(0, 1))
    >>> y = tf.range(8)
    >>> step = pipe.compute_gradients(x, y)
    >>> len(step.events)  # 2 stages x 4 micro-batches x (forward, backward)
    16
    >>> with tf.GradientTape() as tape:  # the same step on the unsplit model
    ...     loss = pipe.loss(y, model(x))
    >>> grads = tape.gradient(loss, model.trainable_variables)
    >>> all(np.allclose(a, b, atol=1e-6) for a, b in zip(step.gradients, grads))
    True
"""

from __future__ import annotations

from tensorfleet.model_parallel.pipeline.runner import Pipeline, StepResult
from tensorfleet.model_parallel.pipeline.schedules import SCHEDULES, Pass, Schedule, ScheduledOp, schedule_orders
from tensorfleet.model_parallel.pipeline.stages import partition_layers
from tensorfleet.model_parallel.pipeline.timeline import (
    TimelineEvent,
    bubble_fraction,
    peak_activations,
    plot_schedule,
    simulate,
    theoretical_bubble,
)

__all__ = [
    "Pass",
    "Pipeline",
    "SCHEDULES",
    "Schedule",
    "ScheduledOp",
    "StepResult",
    "TimelineEvent",
    "bubble_fraction",
    "partition_layers",
    "peak_activations",
    "plot_schedule",
    "schedule_orders",
    "simulate",
    "theoretical_bubble",
]
