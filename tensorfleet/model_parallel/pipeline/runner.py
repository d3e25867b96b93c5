"""The pipeline runner: a Keras model's stages on their devices, one thread per device.

:class:`Pipeline` cuts the model into stages (:mod:`~tensorfleet.model_parallel.pipeline.stages`)
and runs a step by the schedule's orders (:mod:`~tensorfleet.model_parallel.pipeline.schedules`):
one thread per device executes that device's order, waiting for the activations and gradients it
depends on, and records a :class:`~tensorfleet.model_parallel.pipeline.timeline.TimelineEvent` per
forward and backward pass. Gradients are accumulated over micro-batches (and over data-parallel
replicas of the pipeline) so that one step's gradients equal those of the unsplit model on the
whole batch.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any, Sequence

from tensorfleet.compat.keras import module_of
from tensorfleet.model_parallel.chain import chain_layers
from tensorfleet.model_parallel.pipeline.schedules import (
    SCHEDULES,
    Pass,
    Schedule,
    ScheduledOp,
    dependency,
    schedule_orders,
)
from tensorfleet.model_parallel.pipeline.stages import param_count, partition_layers
from tensorfleet.model_parallel.pipeline.timeline import TimelineEvent, bubble_fraction, plot_schedule
from tensorfleet.validation import number, positive_int

__all__ = ["Pipeline", "StepResult"]


@dataclasses.dataclass
class StepResult:
    """What one pipeline step produced."""

    loss: float
    gradients: list[Any]
    events: list[TimelineEvent]
    peak_activations: int

    @property
    def bubble_fraction(self) -> float:
        return bubble_fraction(self.events)


class Pipeline:
    """Runs a Keras model as a pipeline of stages over devices.

    Args:
        model: a built Keras model whose layers form one chain (Sequential, or functional
            without branches; a branching block can be one custom layer).
        num_stages: pipeline devices ``p``. The model is cut into ``p x virtual_stages``
            stages; stage ``k`` runs on pipeline device ``k % p``.
        micro_batches: ``m``, micro-batches per step.
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``.
        virtual_stages: ``v``, model chunks per device (interleaved only).
        boundaries: first-layer indices of each stage after the first; default: balanced by
            parameter count.
        devices: device names, ``data_parallel x p`` of them (default: the logical devices).
        data_parallel: replicas of the whole pipeline, each fed its share of the batch; their
            gradients are summed, which makes a (data x stage) device mesh.
        loss: a Keras loss (mean over the batch); default sparse categorical cross-entropy on
            logits.
        op_cost: optional ``(forward_seconds, backward_seconds)``: every op is padded to take
            at least this long, to run a pipeline with a known compute cost per stage.
        timeout: seconds an op may wait for its input before the step fails.
        input_shape: for a model that is not built yet (a Sequential without an Input), the
            shape of one example: each stage's layers are then built under ``tf.device`` of
            their stage, so that the weights live on the device that uses them. A model that
            is already built keeps its weights where Keras created them, and its stages read
            them from there.

    Example:
        >>> import tensorflow as tf
        >>> import tensorfleet as tfl
        >>> data = tfl.models.datasets.load_digits(flat=True)
        >>> model = tfl.models.build("digits_mlp")
        >>> pipe = Pipeline(model, num_stages=2, micro_batches=4, schedule="gpipe")
        >>> pipe.devices
        ['/device:CPU:0', '/device:CPU:1']
        >>> step = pipe.train_step(data.x_train[:64], data.y_train[:64], tf.keras.optimizers.SGD(0.1))
        >>> [e.phase.value[0] + str(e.micro_batch)  # what device 0 ran, in order: all forwards first
        ...  for e in sorted(step.events, key=lambda e: e.start) if e.device == 0]
        ['f0', 'f1', 'f2', 'f3', 'b0', 'b1', 'b2', 'b3']
        >>> str(pipe.plot(step.events, "schedule.png"))
        'schedule.png'
    """

    def __init__(self, model: Any, *, num_stages: int, micro_batches: int = 4, schedule: str | Schedule = "1f1b",
                 virtual_stages: int = 1, boundaries: Sequence[int] | None = None,
                 devices: Sequence[str] | None = None, data_parallel: int = 1, loss: Any = None,
                 op_cost: tuple[float, float] | None = None, timeout: float = 300.0,
                 input_shape: Sequence[int] | None = None) -> None:
        import tensorflow as tf


        keras = module_of(model, "Pipeline")  # Keras 3 or tf_keras: each stage runs the model's own layers
        self.num_devices = positive_int("num_stages", num_stages)
        self.micro_batches = positive_int("micro_batches", micro_batches)
        self.virtual_stages = positive_int("virtual_stages", virtual_stages)
        self.data_parallel = positive_int("data_parallel", data_parallel)
        self.schedule = SCHEDULES.canonical(schedule.value if isinstance(schedule, Schedule) else schedule)
        self.orders = schedule_orders(self.schedule, self.num_devices, self.micro_batches, self.virtual_stages)
        self.model = model
        self.num_stages = self.num_devices * self.virtual_stages
        needed = self.num_devices * self.data_parallel
        if devices is None:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            if len(devices) < needed:
                raise ValueError(f"A pipeline of {self.num_devices} stage devices x {self.data_parallel} replicas "
                                 f"needs {needed} devices; this machine has {len(devices)}: {devices}")
            devices = devices[:needed]
        self.devices = list(devices)
        if len(self.devices) != needed:
            raise ValueError(f"devices must hold num_stages x data_parallel = {needed} names. "
                             f"Received: {len(self.devices)} devices {self.devices!r}")
        if getattr(model, "built", False):
            self.stages = partition_layers(chain_layers(model), self.num_stages, boundaries=boundaries)
        elif input_shape is None:
            raise ValueError(f"The model must be built before it is split into stages, or pass input_shape so that "
                             f"each stage's weights are created on its device. Received: model "
                             f"{getattr(model, 'name', model)!r} is not built and input_shape=None")
        else:
            self.stages = self._build_on_devices(model, tuple(input_shape), boundaries)
        self.loss = loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if op_cost is not None:
            if len(op_cost) != 2:
                raise ValueError(f"op_cost must be (forward_seconds, backward_seconds). Received: op_cost={op_cost!r}")
            op_cost = (number("op_cost[0]", op_cost[0], minimum=0), number("op_cost[1]", op_cost[1], minimum=0))
        self.op_cost = op_cost
        self.timeout = timeout
        self.stage_variables = [[v for layer in stage for v in layer.trainable_variables] for stage in self.stages]

    def _build_on_devices(self, model: Any, input_shape: tuple[int, ...], boundaries: Sequence[int] | None) -> list:
        import tensorflow as tf

        layers = chain_layers(model)
        weights = None
        if boundaries is None:  # parameter counts need built layers: count them on a throwaway clone
            probe = module_of(model).models.clone_model(model)
            probe.build((None, *input_shape))
            weights = [param_count(layer) for layer in chain_layers(probe)]
        stages = partition_layers(layers, self.num_stages, boundaries=boundaries, weights=weights)
        shape = tf.TensorShape((None, *input_shape))
        for index, stage in enumerate(stages):
            with tf.device(self.device(0, index)):
                for layer in stage:
                    layer.build(shape)
                    shape = tf.TensorShape(layer.compute_output_shape(shape))
        model.build((None, *input_shape))  # the layers are built already: this only wires the model
        return stages

    def device(self, replica: int, stage: int) -> str:
        """The device that runs ``stage`` for data-parallel ``replica``."""
        return self.devices[replica * self.num_devices + stage % self.num_devices]

    def compute_gradients(self, x: Any, y: Any) -> StepResult:
        """One pipeline step: the mean loss of the batch and its gradients (model variable order)."""
        return _PipelineStep(self, x, y).run()

    def train_step(self, x: Any, y: Any, optimizer: Any) -> StepResult:
        """One step: pipeline gradients, then ``optimizer.apply_gradients``."""
        step = self.compute_gradients(x, y)
        pairs = [(g, v) for g, v in zip(step.gradients, self.model.trainable_variables) if g is not None]
        optimizer.apply_gradients(pairs)
        return step

    def fit(self, x: Any, y: Any, *, optimizer: Any, epochs: int = 1, batch_size: int = 32,
            verbose: bool = True) -> dict[str, list[float]]:
        """Trains for ``epochs`` over ``(x, y)`` in order (no shuffling); returns the loss history.

        A last batch smaller than ``batch_size`` is dropped.

        Returns:
            ``{"loss": [mean loss of each epoch], "step_loss": [loss of each step],
            "bubble_fraction": [bubble of each step]}``.
        """
        from tqdm.auto import tqdm

        positive_int("epochs", epochs)
        positive_int("batch_size", batch_size)
        n = int(x.shape[0])
        history: dict[str, list[float]] = {"loss": [], "step_loss": [], "bubble_fraction": []}
        for epoch in range(epochs):
            starts = range(0, n - batch_size + 1, batch_size) or [0]
            bar = tqdm(starts, desc=f"pipeline epoch {epoch + 1}/{epochs}", disable=not verbose, leave=False)
            losses = []
            for s in bar:
                step = self.train_step(x[s:s + batch_size], y[s:s + batch_size], optimizer)
                losses.append(step.loss)
                history["step_loss"].append(step.loss)
                history["bubble_fraction"].append(step.bubble_fraction)
                bar.set_postfix(loss=f"{step.loss:.4f}")
            history["loss"].append(sum(losses) / len(losses))
        return history

    def keras_model(self) -> Any:
        """A ``tf.keras.Model`` whose ``fit`` trains through this pipeline.

        Compile it with an optimizer and ``run_eagerly=True`` (the pipeline's device threads
        run eager TensorFlow); its loss is the pipeline's. ``fit`` then shows Keras' progress
        bar, runs callbacks and records the mean ``loss`` and ``bubble_fraction`` per epoch;
        ``predict`` and ``evaluate`` use the unsplit model.

        Example:
            >>> import tensorfleet as tfl
            >>> data = tfl.models.datasets.load_digits(flat=True)
            >>> pipe = Pipeline(tfl.models.build("digits_mlp"), num_stages=2, micro_batches=4)
            >>> trainer = pipe.keras_model()
            >>> trainer.compile(optimizer="adam", run_eagerly=True)
            >>> history = trainer.fit(data.x_train[:256], data.y_train[:256], batch_size=64, epochs=2,
            ...                       verbose=0)
            >>> sorted(history.history), len(history.history["loss"])
            (['bubble_fraction', 'loss'], 2)
        """
        from tensorfleet.model_parallel.pipeline.keras_model import pipeline_keras_model

        return pipeline_keras_model(self)

    def plot(self, events: Sequence[TimelineEvent], path: str | os.PathLike[str]) -> Any:
        """Saves ``events`` as a PNG Gantt chart titled with this pipeline's schedule."""
        v = f", v={self.virtual_stages}" if self.virtual_stages > 1 else ""
        return plot_schedule(events, path, title=f"{self.schedule}: p={self.num_devices}, m={self.micro_batches}{v}")



class _Failed(Exception):
    """Another device thread failed; this one stops quietly and the caller sees that failure."""


class _PipelineStep:
    """One step in flight: the state the device threads hand activations and gradients through."""

    def __init__(self, pipeline: Pipeline, x: Any, y: Any) -> None:
        import numpy as np
        import tensorflow as tf

        self.pipeline = pipe = pipeline
        self.n = n = int(x.shape[0])
        parts = pipe.data_parallel * pipe.micro_batches
        if n < parts:
            raise ValueError(f"A batch must have at least data_parallel x micro_batches = {parts} examples. "
                             f"Received: batch of {n}")
        bounds = np.linspace(0, n, parts + 1).round().astype(int)
        m = pipe.micro_batches
        self.chunks = {(r, j): (int(bounds[r * m + j]), int(bounds[r * m + j + 1]))
                       for r in range(pipe.data_parallel) for j in range(m)}
        self.x, self.y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        self.done: dict[tuple[int, ScheduledOp], threading.Event] = {
            (r, op): threading.Event() for r in range(pipe.data_parallel) for order in pipe.orders for op in order}
        self.outputs: dict[tuple[int, int, int], Any] = {}
        self.input_grads: dict[tuple[int, int, int], Any] = {}
        self.saved: dict[tuple[int, int, int], Any] = {}
        self.sums: list[list[Any]] = [[None] * len(vs) for vs in pipe.stage_variables]
        self.losses: list[float] = []
        self.events: list[TimelineEvent] = []
        self.peaks: list[int] = []
        self.lock = threading.Lock()
        self.failure: list[BaseException] = []
        self.t0 = time.perf_counter()

    def run(self) -> StepResult:
        pipe = self.pipeline
        threads = [threading.Thread(target=self._run_device, args=(r, d), name=f"pipeline-r{r}-d{d}", daemon=True)
                   for r in range(pipe.data_parallel) for d in range(pipe.num_devices)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.failure:
            raise self.failure[0]
        by_id = {}
        for stage_vars, stage_sums in zip(pipe.stage_variables, self.sums):
            for var, total in zip(stage_vars, stage_sums):
                by_id[id(var)] = total
        gradients = [by_id.get(id(v)) for v in pipe.model.trainable_variables]
        self.events.sort(key=lambda e: (e.start, e.replica, e.device))
        return StepResult(float(sum(self.losses)), gradients, self.events, max(self.peaks) if self.peaks else 0)

    def _wait(self, key: tuple[int, ScheduledOp]) -> None:
        deadline = time.perf_counter() + self.pipeline.timeout
        while not self.done[key].wait(0.05):
            if self.failure:
                raise _Failed()
            if time.perf_counter() > deadline:
                raise TimeoutError(f"Pipeline op {key} waited more than {self.pipeline.timeout} s for its input.")

    def _run_device(self, r: int, d: int) -> None:
        import tensorflow as tf

        pipe = self.pipeline
        live = peak = 0
        try:
            for op in pipe.orders[d]:
                dep = dependency(op, pipe.num_stages)
                if dep is not None:
                    self._wait((r, dep))
                start = time.perf_counter()
                with tf.device(pipe.device(r, op.stage)):
                    if op.phase is Pass.FORWARD:
                        placed = self._forward(r, op)
                        live += 1
                        peak = max(peak, live)
                    else:
                        placed = self._backward(r, op)
                        live -= 1
                if pipe.op_cost is not None:
                    cost = pipe.op_cost[0 if op.phase is Pass.FORWARD else 1]
                    while time.perf_counter() - start < cost:
                        time.sleep(max(0.0, cost - (time.perf_counter() - start)))
                end = time.perf_counter()
                with self.lock:
                    self.events.append(TimelineEvent(d, op.stage, op.micro_batch, op.phase, start - self.t0,
                                                     end - self.t0, r, placed))
                self.done[(r, op)].set()
            with self.lock:
                self.peaks.append(peak)
        except _Failed:
            return
        except BaseException as exc:  # surfaced in the caller's thread
            with self.lock:
                self.failure.append(exc)

    def _forward(self, r: int, op: ScheduledOp) -> str:
        import tensorflow as tf

        pipe = self.pipeline
        a, b = self.chunks[(r, op.micro_batch)]
        key = (r, op.stage, op.micro_batch)
        source = self.x[a:b] if op.stage == 0 else self.outputs.pop((r, op.stage - 1, op.micro_batch))
        with tf.GradientTape() as tape:
            inputs = tf.identity(source)  # the transfer from the previous stage's device
            tape.watch(inputs)
            h = inputs
            for layer in pipe.stages[op.stage]:
                h = layer(h, training=True)
            if op.stage == pipe.num_stages - 1:
                # Scaled so that the micro-batch losses add up to the whole batch's mean loss.
                h = pipe.loss(self.y[a:b], h) * ((b - a) / self.n)
                with self.lock:
                    self.losses.append(float(h))
        self.saved[key] = (tape, inputs, h)
        if op.stage < pipe.num_stages - 1:
            self.outputs[key] = h
        return h.device

    def _backward(self, r: int, op: ScheduledOp) -> str:
        import tensorflow as tf

        pipe = self.pipeline
        key = (r, op.stage, op.micro_batch)
        tape, inputs, result = self.saved.pop(key)
        last = op.stage == pipe.num_stages - 1
        upstream = None if last else tf.identity(self.input_grads.pop((r, op.stage + 1, op.micro_batch)))
        variables = pipe.stage_variables[op.stage]
        sources = ([inputs] if op.stage > 0 else []) + variables
        if not sources:
            return ""
        grads = tape.gradient(result, sources, output_gradients=upstream)
        if op.stage > 0:
            self.input_grads[key] = grads[0]
            grads = grads[1:]
        with self.lock:
            stage_sums = self.sums[op.stage]
            for i, g in enumerate(grads):
                if g is None:
                    continue
                g = tf.convert_to_tensor(g)
                stage_sums[i] = g if stage_sums[i] is None else stage_sums[i] + g
        placed = [g for g in grads if g is not None]
        return tf.convert_to_tensor(placed[0]).device if placed else ""
