"""Pipeline model parallelism for Keras models: stages, micro-batches and schedules.

A model is cut into consecutive stages, each on its own device; a batch is cut into ``m``
micro-batches that flow through the stages, so that the devices work at the same time on
different micro-batches. Three schedules decide the order of each device's forward and
backward passes:

- ``gpipe``: all forward passes, then all backward passes (Huang et al., "GPipe: Efficient
  Training of Giant Neural Networks using Pipeline Parallelism", 2019). Each device holds the
  activations of all ``m`` micro-batches at its peak.
- ``1f1b``: after ``p - s - 1`` warm-up forwards, stage ``s`` alternates one forward and one
  backward (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
  Training", 2019; the flushing variant of "Memory-Efficient Pipeline-Parallel DNN
  Training", 2021). Same bubble as GPipe, at most ``p`` micro-batches of activations held.
- ``interleaved``: each device holds ``v`` non-consecutive model chunks (virtual stages), which
  shrinks the bubble by ``v`` (Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", 2021). Needs ``m`` to be a multiple of ``p``.

With equal per-stage cost the bubble fraction (idle share of device time) is
``(p - 1) / (m + p - 1)`` for GPipe and 1F1B and ``(p - 1) / (v m + p - 1)`` interleaved.

The orders are pure functions (:func:`schedule_orders`) and :func:`simulate` lays them out in
time for given costs; :class:`Pipeline` runs them for real: one thread per device executes
that device's order, waiting for the activations and gradients it depends on, and records a
:class:`Event` per forward and backward pass. Gradients are accumulated over micro-batches
(and over data-parallel replicas of the pipeline) so that one step's gradients equal those of
the unsplit model on the whole batch.

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

import dataclasses
import enum
import os
import threading
import time
from typing import Any, Callable, Sequence

from tensorfleet.registry import Registry

__all__ = [
    "Event",
    "Op",
    "Phase",
    "Pipeline",
    "SCHEDULES",
    "Schedule",
    "StepResult",
    "bubble_fraction",
    "partition_layers",
    "peak_activations",
    "plot_schedule",
    "schedule_orders",
    "simulate",
    "theoretical_bubble",
]


class Schedule(str, enum.Enum):
    """The pipeline schedules."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class Phase(str, enum.Enum):
    """A pass of one micro-batch through one stage."""

    FORWARD = "forward"
    BACKWARD = "backward"


@dataclasses.dataclass(frozen=True)
class Op:
    """One unit of work in a device's order: ``phase`` of ``micro_batch`` through ``stage``."""

    phase: Phase
    stage: int
    micro_batch: int


@dataclasses.dataclass(frozen=True)
class Event:
    """One executed (or simulated) op with its start and end time in seconds (or cost units)."""

    device: int
    stage: int
    micro_batch: int
    phase: Phase
    start: float
    end: float
    replica: int = 0
    placed_on: str = ""
    """Where the op's result tensor was placed (real runs only), e.g. ``/job:localhost/.../device:CPU:1``."""


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}. Received: {name}={value!r}")
    return value


def _gpipe(p: int, m: int, v: int) -> list[list[Op]]:
    return [[Op(Phase.FORWARD, d, j) for j in range(m)] + [Op(Phase.BACKWARD, d, j) for j in range(m)]
            for d in range(p)]


def _one_f_one_b(p: int, m: int, v: int) -> list[list[Op]]:
    orders = []
    for d in range(p):
        warmup = min(p - d - 1, m)
        ops = [Op(Phase.FORWARD, d, j) for j in range(warmup)]
        for j in range(warmup, m):
            ops += [Op(Phase.FORWARD, d, j), Op(Phase.BACKWARD, d, j - warmup)]
        ops += [Op(Phase.BACKWARD, d, j) for j in range(m - warmup, m)]
        orders.append(ops)
    return orders


def _interleaved(p: int, m: int, v: int) -> list[list[Op]]:
    # Megatron-LM's forward_backward_pipelining_with_interleaving: micro-batches go round the
    # device's chunks in groups of p; chunk c of device d is stage c * p + d.
    if m % p != 0:
        raise ValueError(
            "The interleaved schedule needs micro_batches to be a multiple of the number of pipeline "
            f"devices. Received: micro_batches={m}, devices={p}"
        )
    total = m * v

    def forward(d: int, k: int) -> Op:
        return Op(Phase.FORWARD, ((k // p) % v) * p + d, (k // (p * v)) * p + k % p)

    def backward(d: int, k: int) -> Op:
        return Op(Phase.BACKWARD, (v - 1 - (k // p) % v) * p + d, (k // (p * v)) * p + k % p)

    orders = []
    for d in range(p):
        warmup = total if m == p else min((p - d - 1) * 2 + (v - 1) * p, total)
        ops = [forward(d, k) for k in range(warmup)]
        for i in range(total - warmup):
            ops += [forward(d, warmup + i), backward(d, i)]
        ops += [backward(d, i) for i in range(total - warmup, total)]
        orders.append(ops)
    return orders


SCHEDULES: Registry[Callable[[int, int, int], list[list[Op]]]] = Registry("pipeline schedule")
SCHEDULES.register("gpipe", _gpipe, description="All forward passes, then all backward passes (GPipe).")
SCHEDULES.register("1f1b", _one_f_one_b, aliases=("one_f_one_b", "pipedream_flush"),
                   description="Warm-up forwards, then one forward one backward (PipeDream-Flush).")
SCHEDULES.register("interleaved", _interleaved, aliases=("interleaved_1f1b",),
                   description="1F1B over v virtual stages per device (Megatron-LM interleaved).")


def schedule_orders(schedule: str | Schedule, num_devices: int, micro_batches: int,
                    virtual_stages: int = 1) -> list[list[Op]]:
    """Each device's order of ops for one step.

    Args:
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``.
        num_devices: pipeline devices ``p``.
        micro_batches: ``m``.
        virtual_stages: ``v``, chunks per device (interleaved only; stage ``c p + d`` is chunk
            ``c`` of device ``d``).

    Example:
        >>> [str(op.phase.value[0]) + str(op.micro_batch) for op in schedule_orders("1f1b", 2, 3)[0]]
        ['f0', 'f1', 'b0', 'f2', 'b1', 'b2']
    """
    name = SCHEDULES.canonical(schedule.value if isinstance(schedule, Schedule) else schedule)
    p = _check_int("num_devices", num_devices)
    m = _check_int("micro_batches", micro_batches)
    v = _check_int("virtual_stages", virtual_stages)
    if v != 1 and name != Schedule.INTERLEAVED.value:
        raise ValueError(f"virtual_stages applies to the 'interleaved' schedule only. "
                         f"Received: schedule={name!r}, virtual_stages={v}")
    return SCHEDULES.get(name)(p, m, v)


def _dependency(op: Op, num_stages: int) -> Op | None:
    if op.phase is Phase.FORWARD:
        return Op(Phase.FORWARD, op.stage - 1, op.micro_batch) if op.stage > 0 else None
    if op.stage == num_stages - 1:
        return Op(Phase.FORWARD, op.stage, op.micro_batch)
    return Op(Phase.BACKWARD, op.stage + 1, op.micro_batch)


def simulate(orders: Sequence[Sequence[Op]], *, forward_cost: float = 1.0, backward_cost: float = 2.0) -> list[Event]:
    """Lays the orders out in time with fixed per-op costs (no communication cost).

    Each op starts when its device is free and the op it depends on (the previous stage's
    forward, the next stage's backward) has ended.

    Example:
        >>> events = simulate(schedule_orders("gpipe", 2, 2))
        >>> round(bubble_fraction(events), 4)
        0.3333
    """
    num_stages = 1 + max(op.stage for order in orders for op in order)
    ends: dict[Op, float] = {}
    free = [0.0] * len(orders)
    position = [0] * len(orders)
    events: list[Event] = []
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for d, order in enumerate(orders):
            while position[d] < len(order):
                op = order[position[d]]
                dep = _dependency(op, num_stages)
                if dep is not None and dep not in ends:
                    break
                start = max(free[d], ends[dep] if dep is not None else 0.0)
                end = start + (forward_cost if op.phase is Phase.FORWARD else backward_cost)
                ends[op], free[d] = end, end
                events.append(Event(d, op.stage, op.micro_batch, op.phase, start, end))
                position[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"The pipeline orders deadlock: {[order[i] for order, i in zip(orders, position) if i < len(order)]}")
    return events


def bubble_fraction(events: Sequence[Event], num_devices: int | None = None) -> float:
    """Share of device time spent idle: ``1 - busy / (devices x makespan)``."""
    if not events:
        raise ValueError("bubble_fraction needs at least one event. Received: events=[]")
    devices = num_devices or len({(e.replica, e.device) for e in events})
    begin = min(e.start for e in events)
    makespan = max(e.end for e in events) - begin
    busy = sum(e.end - e.start for e in events)
    return 1.0 - busy / (devices * makespan)


def theoretical_bubble(num_devices: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """``(p - 1) / (v m + p - 1)``: the bubble fraction of GPipe / 1F1B (``v = 1``) and interleaved."""
    p, m, v = num_devices, micro_batches, virtual_stages
    return (p - 1) / (v * m + p - 1)


def peak_activations(events: Sequence[Event]) -> int:
    """Most micro-batch activations one device holds at once (forward done, backward not)."""
    peak = 0
    by_device: dict[tuple[int, int], list[Event]] = {}
    for e in events:
        by_device.setdefault((e.replica, e.device), []).append(e)
    for device_events in by_device.values():
        live = 0
        for e in sorted(device_events, key=lambda e: (e.start, e.end)):
            live += 1 if e.phase is Phase.FORWARD else -1
            peak = max(peak, live)
    return peak


def plot_schedule(events: Sequence[Event], path: str | os.PathLike[str], *, title: str = "Pipeline schedule") -> Any:
    """Draws the timeline as a Gantt chart (one row per device) and saves it as a PNG.

    Forward passes are blue, backward passes orange; each bar shows its micro-batch number,
    and with interleaving a hatch tells the device's model chunks (virtual stages) apart.
    """
    if not events:
        raise ValueError("plot_schedule needs at least one event. Received: events=[]")
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from tensorfleet.io import save_figure

    rows = sorted({(e.replica, e.device) for e in events})
    row_of = {key: i for i, key in enumerate(rows)}
    begin = min(e.start for e in events)
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 1.2))
    colours = {Phase.FORWARD: "#4C72B0", Phase.BACKWARD: "#DD8452"}
    devices = len({e.device for e in events})
    hatches = ("", "//", "xx", "..")
    for e in events:
        y = row_of[(e.replica, e.device)]
        chunk = e.stage // devices  # interleaved: which of the device's model chunks
        ax.barh(y, e.end - e.start, left=e.start - begin, color=colours[e.phase], edgecolor="black", height=0.8,
                hatch=hatches[chunk % len(hatches)])
        ax.text((e.start + e.end) / 2 - begin, y, str(e.micro_batch), ha="center", va="center", fontsize=7,
                color="white")
    labels = [f"replica {r} / device {d}" if len(rows) > len({d for _, d in rows}) else f"device {d}" for r, d in rows]
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time")
    ax.set_title(f"{title} (bubble {bubble_fraction(events):.1%})")
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=p.value) for p, c in colours.items()]
    chunks = 1 + max(e.stage for e in events) // devices
    handles += [Patch(facecolor="white", edgecolor="black", hatch=hatches[c % len(hatches)], label=f"chunk {c}")
                for c in range(chunks) if chunks > 1]
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    return save_figure(fig, path)


def _chain_layers(model: Any) -> list[Any]:
    import tensorflow as tf

    layers = [layer for layer in model.layers if not isinstance(layer, tf.keras.layers.InputLayer)]
    if not layers:
        raise ValueError(f"Model {model.name!r} has no layers to split into pipeline stages.")
    if not isinstance(model, tf.keras.Sequential):
        previous = None
        for layer in layers:
            inbound = [l for node in layer.inbound_nodes for l in tf.nest.flatten(node.inbound_layers)]
            if len(layer.inbound_nodes) != 1 or len(inbound) != 1 or (
                    previous is not None and inbound[0] is not previous):
                raise ValueError(
                    f"Pipeline stages need a model whose layers form one chain (each layer feeding the next); "
                    f"layer {layer.name!r} of model {model.name!r} does not. Wrap branching parts in one layer.")
            previous = layer
    return layers


def _param_count(layer: Any) -> int:
    return int(sum(int(v.shape.num_elements()) for v in layer.trainable_variables))


def partition_layers(layers: Sequence[Any], num_stages: int, *, boundaries: Sequence[int] | None = None,
                     weights: Sequence[int] | None = None) -> list[list[Any]]:
    """Cuts a chain of layers into ``num_stages`` consecutive, non-empty stages.

    Args:
        layers: the chain.
        num_stages: how many stages.
        boundaries: the index of the first layer of every stage after the first (for 3
            stages of 6 layers, ``[2, 4]``). If None, stages are balanced by ``weights``.
        weights: cost of each layer (default: its trainable parameter count); the cut
            minimises the largest stage total.

    Example:
        >>> partition_layers(list("abcdef"), 3, boundaries=[2, 4])
        [['a', 'b'], ['c', 'd'], ['e', 'f']]
    """
    n = len(layers)
    k = _check_int("num_stages", num_stages)
    if k > n:
        raise ValueError(f"num_stages must be at most the number of layers ({n}) so that no stage is empty. "
                         f"Received: num_stages={k}")
    if boundaries is not None:
        cuts = list(boundaries)
        if len(cuts) != k - 1 or any(not isinstance(c, int) for c in cuts) or cuts != sorted(set(cuts)) or (
                cuts and (cuts[0] <= 0 or cuts[-1] >= n)):
            raise ValueError(
                f"boundaries must be {k - 1} increasing layer indices between 1 and {n - 1} (the first layer of "
                f"each stage after the first). Received: boundaries={list(boundaries)!r}")
    else:
        w = list(weights) if weights is not None else [_param_count(layer) for layer in layers]
        cuts = _balanced_cuts(w, k)
    edges = [0, *cuts, n]
    return [list(layers[a:b]) for a, b in zip(edges, edges[1:])]


def _balanced_cuts(weights: list[int], k: int) -> list[int]:
    # Linear partition by dynamic programming: minimise the heaviest stage; ties go to the cut
    # that keeps earlier stages lighter.
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for s in range(1, k + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                cost = max(best[s - 1][j], prefix[i] - prefix[j])
                if cost < best[s][i]:
                    best[s][i], cut[s][i] = cost, j
    cuts, i = [], n
    for s in range(k, 0, -1):
        i = cut[s][i]
        cuts.append(i)
    return sorted(cuts)[1:]


@dataclasses.dataclass
class StepResult:
    """What one pipeline step produced."""

    loss: float
    gradients: list[Any]
    events: list[Event]
    peak_activations: int

    @property
    def bubble_fraction(self) -> float:
        return bubble_fraction(self.events)


class _Failed(Exception):
    pass


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

        self.num_devices = _check_int("num_stages", num_stages)
        self.micro_batches = _check_int("micro_batches", micro_batches)
        self.virtual_stages = _check_int("virtual_stages", virtual_stages)
        self.data_parallel = _check_int("data_parallel", data_parallel)
        self.schedule = SCHEDULES.canonical(schedule.value if isinstance(schedule, Schedule) else schedule)
        self.orders = schedule_orders(self.schedule, self.num_devices, self.micro_batches, self.virtual_stages)
        self.model = model
        self.num_stages = self.num_devices * self.virtual_stages
        needed = self.num_devices * self.data_parallel
        if devices is None:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            if len(devices) < needed:
                raise ValueError(f"A pipeline of {self.num_devices} stage devices x {self.data_parallel} replicas needs "
                                 f"{needed} devices; this machine has {len(devices)}: {devices}")
            devices = devices[:needed]
        self.devices = list(devices)
        if len(self.devices) != needed:
            raise ValueError(f"devices must hold num_stages x data_parallel = {needed} names. "
                             f"Received: {len(self.devices)} devices {self.devices!r}")
        if getattr(model, "built", False):
            self.stages = partition_layers(_chain_layers(model), self.num_stages, boundaries=boundaries)
        elif input_shape is None:
            raise ValueError(f"The model must be built before it is split into stages, or pass input_shape so that "
                             f"each stage's weights are created on its device. Received: model "
                             f"{getattr(model, 'name', model)!r} is not built and input_shape=None")
        else:
            self.stages = self._build_on_devices(model, tuple(input_shape), boundaries)
        self.loss = loss or tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if op_cost is not None and (len(op_cost) != 2 or min(op_cost) < 0):
            raise ValueError(f"op_cost must be (forward_seconds, backward_seconds), both >= 0. Received: op_cost={op_cost!r}")
        self.op_cost = op_cost
        self.timeout = timeout
        self.stage_variables = [[v for layer in stage for v in layer.trainable_variables] for stage in self.stages]

    def _build_on_devices(self, model: Any, input_shape: tuple[int, ...], boundaries: Sequence[int] | None) -> list:
        import tensorflow as tf

        layers = _chain_layers(model)
        weights = None
        if boundaries is None:  # parameter counts need built layers: count them on a throwaway clone
            probe = tf.keras.models.clone_model(model)
            probe.build((None, *input_shape))
            weights = [_param_count(layer) for layer in _chain_layers(probe)]
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
        import numpy as np
        import tensorflow as tf

        n = int(x.shape[0])
        parts = self.data_parallel * self.micro_batches
        if n < parts:
            raise ValueError(f"A batch must have at least data_parallel x micro_batches = {parts} examples. "
                             f"Received: batch of {n}")
        bounds = np.linspace(0, n, parts + 1).round().astype(int)
        chunks = {(r, j): (int(bounds[r * self.micro_batches + j]), int(bounds[r * self.micro_batches + j + 1]))
                  for r in range(self.data_parallel) for j in range(self.micro_batches)}
        x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        done: dict[tuple[int, Op], threading.Event] = {
            (r, op): threading.Event() for r in range(self.data_parallel) for order in self.orders for op in order}
        outputs: dict[tuple[int, int, int], Any] = {}
        input_grads: dict[tuple[int, int, int], Any] = {}
        saved: dict[tuple[int, int, int], Any] = {}
        sums: list[list[Any]] = [[None] * len(vs) for vs in self.stage_variables]
        losses: list[float] = []
        events: list[Event] = []
        peaks: list[int] = []
        lock = threading.Lock()
        failure: list[BaseException] = []
        t0 = time.perf_counter()

        def wait(key: tuple[int, Op]) -> None:
            deadline = time.perf_counter() + self.timeout
            while not done[key].wait(0.05):
                if failure:
                    raise _Failed()
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"Pipeline op {key} waited more than {self.timeout} s for its input.")

        def run_device(r: int, d: int) -> None:
            live = peak = 0
            try:
                for op in self.orders[d]:
                    dep = _dependency(op, self.num_stages)
                    if dep is not None:
                        wait((r, dep))
                    start = time.perf_counter()
                    with tf.device(self.device(r, op.stage)):
                        if op.phase is Phase.FORWARD:
                            placed = self._forward(r, op, chunks[(r, op.micro_batch)], n, x, y, outputs, saved,
                                                   losses, lock)
                            live += 1
                            peak = max(peak, live)
                        else:
                            placed = self._backward(r, op, outputs, input_grads, saved, sums, lock)
                            live -= 1
                    if self.op_cost is not None:
                        cost = self.op_cost[0 if op.phase is Phase.FORWARD else 1]
                        while time.perf_counter() - start < cost:
                            time.sleep(max(0.0, cost - (time.perf_counter() - start)))
                    end = time.perf_counter()
                    with lock:
                        events.append(Event(d, op.stage, op.micro_batch, op.phase, start - t0, end - t0, r, placed))
                    done[(r, op)].set()
                with lock:
                    peaks.append(peak)
            except _Failed:
                return
            except BaseException as exc:  # surfaced in the caller's thread
                with lock:
                    failure.append(exc)

        threads = [threading.Thread(target=run_device, args=(r, d), name=f"pipeline-r{r}-d{d}", daemon=True)
                   for r in range(self.data_parallel) for d in range(self.num_devices)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failure:
            raise failure[0]
        by_ref = {}
        for stage_vars, stage_sums in zip(self.stage_variables, sums):
            for var, total in zip(stage_vars, stage_sums):
                by_ref[var.ref()] = total
        gradients = [by_ref.get(v.ref()) for v in self.model.trainable_variables]
        events.sort(key=lambda e: (e.start, e.replica, e.device))
        return StepResult(float(sum(losses)), gradients, events, max(peaks) if peaks else 0)

    def _forward(self, r: int, op: Op, chunk: tuple[int, int], n: int, x: Any, y: Any, outputs: dict,
                 saved: dict, losses: list, lock: threading.Lock) -> str:
        import tensorflow as tf

        a, b = chunk
        key = (r, op.stage, op.micro_batch)
        source = x[a:b] if op.stage == 0 else outputs.pop((r, op.stage - 1, op.micro_batch))
        with tf.GradientTape() as tape:
            inputs = tf.identity(source)  # the transfer from the previous stage's device
            tape.watch(inputs)
            h = inputs
            for layer in self.stages[op.stage]:
                h = layer(h, training=True)
            if op.stage == self.num_stages - 1:
                # Scaled so that the micro-batch losses add up to the whole batch's mean loss.
                h = self.loss(y[a:b], h) * ((b - a) / n)
                with lock:
                    losses.append(float(h))
        saved[key] = (tape, inputs, h)
        if op.stage < self.num_stages - 1:
            outputs[key] = h
        return h.device

    def _backward(self, r: int, op: Op, outputs: dict, input_grads: dict, saved: dict, sums: list,
                  lock: threading.Lock) -> str:
        import tensorflow as tf

        key = (r, op.stage, op.micro_batch)
        tape, inputs, result = saved.pop(key)
        upstream = None if op.stage == self.num_stages - 1 else tf.identity(input_grads.pop((r, op.stage + 1, op.micro_batch)))
        variables = self.stage_variables[op.stage]
        sources = ([inputs] if op.stage > 0 else []) + variables
        if not sources:
            return ""
        grads = tape.gradient(result, sources, output_gradients=upstream)
        if op.stage > 0:
            input_grads[key] = grads[0]
            grads = grads[1:]
        with lock:
            stage_sums = sums[op.stage]
            for i, g in enumerate(grads):
                if g is None:
                    continue
                g = tf.convert_to_tensor(g)
                stage_sums[i] = g if stage_sums[i] is None else stage_sums[i] + g
        placed = [g for g in grads if g is not None]
        return tf.convert_to_tensor(placed[0]).device if placed else ""

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

        _check_int("epochs", epochs)
        _check_int("batch_size", batch_size)
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
        return _keras_pipeline_model(self)

    def plot(self, events: Sequence[Event], path: str | os.PathLike[str]) -> Any:
        """Saves ``events`` as a PNG Gantt chart titled with this pipeline's schedule."""
        v = f", v={self.virtual_stages}" if self.virtual_stages > 1 else ""
        return plot_schedule(events, path, title=f"{self.schedule}: p={self.num_devices}, m={self.micro_batches}{v}")


def _keras_pipeline_model(pipeline: Pipeline) -> Any:
    import tensorflow as tf

    class PipelineModel(tf.keras.Model):
        """Keras front of a :class:`Pipeline`: ``train_step`` is one pipeline step."""

        def __init__(self) -> None:
            super().__init__(name=f"{pipeline.model.name}_pipeline")
            self.pipeline = pipeline
            self.inner = pipeline.model
            self.loss_tracker = tf.keras.metrics.Mean(name="loss")
            self.bubble_tracker = tf.keras.metrics.Mean(name="bubble_fraction")

        def call(self, inputs: Any, training: Any = None) -> Any:
            return self.inner(inputs, training=training)

        @property
        def metrics(self) -> list[Any]:
            return [self.loss_tracker, self.bubble_tracker]

        def train_step(self, data: Any) -> dict[str, Any]:
            if tf.executing_eagerly() is False:
                raise RuntimeError("A pipeline model trains eagerly: compile it with run_eagerly=True.")
            x, y = data[0], data[1]
            step = self.pipeline.compute_gradients(x, y)
            pairs = [(g, v) for g, v in zip(step.gradients, self.inner.trainable_variables) if g is not None]
            self.optimizer.apply_gradients(pairs)
            self.loss_tracker.update_state(step.loss)
            self.bubble_tracker.update_state(step.bubble_fraction)
            return {m.name: m.result() for m in self.metrics}

        def test_step(self, data: Any) -> dict[str, Any]:
            x, y = data[0], data[1]
            self.loss_tracker.update_state(self.pipeline.loss(y, self.inner(x, training=False)))
            return {"loss": self.loss_tracker.result()}

    return PipelineModel()
