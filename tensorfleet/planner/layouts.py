"""The layouts the planner ranks, one :data:`LAYOUTS` entry each, with their memory and time.

A layout lays a model over the devices with degrees of data, tensor and pipeline parallelism
(:class:`Degrees`). Each entry says which degrees it tries on a :class:`PlanSetup`, what one
device holds (:meth:`ParallelLayout.memory`) and what one step communicates
(:meth:`ParallelLayout.comm_seconds`):

* memory per device from :mod:`tensorfleet.planner.memory` (ZeRO's model-state accounting,
  activations per micro-batch; with ``zero`` 1-3 the optimizer state, then the gradients, then the
  parameters sharded over the data-parallel replicas, except in ``data_ps``); parameter servers keep the float32 weights
  and the optimizer state, sharded evenly over them (as TensorFlow's variable partitioners do), and must fit
  their own memory;
* communication per step from the alpha-beta model of :mod:`tensorfleet.planner.cost_model`:
  data parallel all-reduces the gradients (ring; two-level when there are several machines)
  (ZeRO stage 3 adds an all-gather of the parameters: 1.5 times the bytes, Rajbhandari et al.)
  or pushes gradients to the parameter servers and pulls weights back (one worker too);
  tensor parallelism all-reduces activations (Megatron-LM: 4 per transformer layer per
  step); a pipeline sends activations and their gradients between neighbouring stages once
  per micro-batch;
* compute per step, for every layout, as ``6 x parameters x tokens / (devices x device FLOP/s)``
  (Kaplan et al. 2020), stretched by the pipeline bubble ``(P-1) / (m+P-1)`` (Huang et al.,
  GPipe, 2019) and by one more forward pass (8/6) under full recomputation, which a layout
  gets when it does not fit without it.

Example:
    >>> LAYOUTS.names()
    ['data_allreduce', 'data_ps', 'tensor', 'pipeline', 'hybrid']
    >>> LAYOUTS.canonical("ps")
    'data_ps'
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple

from tensorfleet.planner import cost_model
from tensorfleet.planner.memory import (
    MemoryEstimate,
    bytes_per_parameter,
    estimate_from_counts,
    format_bytes,
    split_stages,
)
from tensorfleet.planner.workload import Workload
from tensorfleet.registry import Registry

__all__ = [
    "LAYOUTS",
    "DataAllReduceLayout",
    "DataParallelLayout",
    "Degrees",
    "HybridLayout",
    "ParallelLayout",
    "ParameterServerLayout",
    "PipelineLayout",
    "PlanRow",
    "PlanSetup",
    "TensorParallelLayout",
]


class Degrees(NamedTuple):
    """Degrees of data, tensor and pipeline parallelism; their product is the device count."""

    data: int
    tensor: int
    pipeline: int


@dataclass(frozen=True)
class PlanSetup:
    """The model, the cluster and the training choices one plan is made for (checked by ``plan``)."""

    work: Workload
    batch_size: int
    devices: int
    nodes: int
    device_memory: float
    intra: cost_model.Link
    inter: cost_model.Link
    device_tflops: float
    optimizer: str
    precision: str
    value_bytes: int
    recompute: bool | None
    ps_servers: int = 1
    server_memory: float | None = None  # None: as much as a device
    zero: int = 0  # ZeRO stage over the data-parallel replicas
    compression: str | None = None  # the all-reduce's gradient compression (strategies.compression)

    @property
    def server_capacity(self) -> float:
        return self.device_memory if self.server_memory is None else self.server_memory

    @property
    def per_node(self) -> int:
        return self.devices // self.nodes

    @property
    def compute_seconds(self) -> float:
        """One step's compute with every device busy (no bubble, no recomputation)."""
        return self.work.flops_per_example * self.batch_size / (self.devices * (self.device_tflops * 1e12))

    @property
    def gradient_bytes(self) -> float:
        return self.work.parameters * self.value_bytes

    @property
    def all_reduced_gradient_bytes(self) -> float:
        """The gradients' bytes as the all-reduce carries them, after ``compression``."""
        return self.gradient_bytes / cost_model.compression_ratio(self.compression, self.work.gradient_shapes(),
                                                                   self.value_bytes)

    def all_reduce_seconds(self, nbytes: float, group: int, *, spans_nodes: bool) -> float:
        """A ring all-reduce over ``group`` devices; two-level when it spans every machine evenly."""
        if group == 1:
            return 0.0
        if spans_nodes and self.nodes > 1 and group % self.nodes == 0:
            return cost_model.predict_hierarchical(self.nodes, group // self.nodes, nbytes, intra=self.intra,
                                                   inter=self.inter)
        return cost_model.predict("ring", group, nbytes, self.inter if spans_nodes and self.nodes > 1 else self.intra)

    def inputs(self) -> dict[str, Any]:
        """The plan's inputs in numbers (bytes, bytes/s, seconds), for its JSON."""
        return {"batch_size": self.batch_size, "devices": self.devices, "nodes": self.nodes,
                "device_memory_bytes": self.device_memory, "bandwidth_bytes_per_s": self.inter.bandwidth,
                "intra_bandwidth_bytes_per_s": self.intra.bandwidth, "latency_s": self.inter.alpha,
                "device_tflops": self.device_tflops, "optimizer": self.optimizer, "precision": self.precision,
                "recompute": self.recompute, "ps_servers": self.ps_servers,
                "server_memory_bytes": self.server_capacity, "server_memory_given": self.server_memory is not None,
                "zero": self.zero, "compression": self.compression}


@dataclass
class PlanRow:
    """One layout's degrees, memory per device and time per step."""

    strategy: str
    layout: dict[str, int]
    memory: MemoryEstimate
    fits: bool
    comm_seconds: float
    compute_seconds: float
    note: str = ""
    server_memory: float | None = None  # bytes per parameter server, for layouts that have them

    @property
    def step_seconds(self) -> float:
        return self.comm_seconds + self.compute_seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "layout": self.layout,
            "fits": self.fits,
            "memory_per_device_bytes": self.memory.total,
            "memory": {k: v for k, v in self.memory.as_dict().items() if isinstance(v, (int, float))},
            "comm_seconds": self.comm_seconds,
            "compute_seconds": self.compute_seconds,
            "step_seconds": self.step_seconds,
            "note": self.note,
            "server_memory_bytes": self.server_memory,
        }


def _suggest_micro_batches(batch: int, stages: int) -> int:
    """The smallest divisor of ``batch`` of at least 4 x stages (bubble <= 20%), else ``batch``."""
    for m in range(min(4 * stages, batch), batch + 1):
        if batch % m == 0:
            return m
    return batch


class ParallelLayout:
    """A way to lay a model over the devices: a :data:`LAYOUTS` entry.

    A subclass says which :class:`Degrees` it tries (:meth:`degrees`) and what a step
    communicates (:meth:`comm_seconds`); it may change the memory a device holds
    (:meth:`memory`) and the row's note (:meth:`note`). :meth:`cost` does the rest. A new layout
    is registered as ``LAYOUTS.register(layout.name, layout, description=...)``; ``plan`` costs it
    beside the others.
    """

    name = ""

    def degrees(self, setup: PlanSetup) -> list[Degrees]:
        raise NotImplementedError

    def comm_seconds(self, setup: PlanSetup, degrees: Degrees, micro: int) -> float:
        raise NotImplementedError

    def note(self, setup: PlanSetup) -> str:
        return ""

    def memory(self, setup: PlanSetup, degrees: Degrees, micro: int, *, recompute: bool = False) -> MemoryEstimate:
        """What the fullest device holds; with ``recompute``, only each layer's checkpoint plus the
        full activations of the one layer being recomputed."""
        work, (data, tensor, pipeline) = setup.work, degrees
        groups = split_stages([max(p, 1e-9) for p in work.layer_parameters], pipeline)
        kept = work.checkpoint_activations if recompute and work.checkpoint_activations else work.layer_activations
        est = estimate_from_counts(
            stage_parameters=[sum(work.layer_parameters[i] for i in g) for g in groups],
            stage_activation_values=[sum(kept[i] for i in g) for g in groups], batch_size=setup.batch_size,
            optimizer=setup.optimizer, precision=setup.precision,
            parallelism="data" if (tensor, pipeline) == (1, 1) else "hybrid", devices=data * tensor * pipeline,
            tensor=tensor, micro_batches=micro, zero=setup.zero)
        if not recompute:
            return est
        # The layer being rebuilt holds its full activations; its checkpoint is counted already.
        rebuilt = max(a - c for a, c in zip(work.layer_activations, work.checkpoint_activations))  # type: ignore[arg-type]
        extra = rebuilt * est.micro_batch * setup.value_bytes / tensor
        return replace(est, activations=est.activations + extra)

    def cost(self, setup: PlanSetup) -> PlanRow | str | None:
        """The best of this layout's degrees (fitting first, then the shortest step), or why none is
        possible."""
        best: PlanRow | None = None
        reason = None
        for degrees in self.degrees(setup):
            row = self.cost_degrees(setup, degrees)
            if isinstance(row, str):
                reason = reason or row
            elif best is None or (row.fits, -row.step_seconds) > (best.fits, -best.step_seconds):
                best = row
        return best if best is not None else reason

    def cost_degrees(self, setup: PlanSetup, degrees: Degrees) -> PlanRow | str:
        """The row of one set of degrees, or why it is not possible."""
        work, data, pipeline = setup.work, degrees.data, degrees.pipeline
        if setup.batch_size % data:
            return f"batch {setup.batch_size} does not split over {data} replicas"
        if pipeline > len(work.layer_parameters):
            return f"{pipeline} stages but only {len(work.layer_parameters)} layers"
        micro = _suggest_micro_batches(setup.batch_size // data, pipeline) if pipeline > 1 else 1
        note = self.note(setup)
        notes = [note] if note else []
        est = self.memory(setup, degrees, micro)
        compute = setup.compute_seconds
        if est.total > setup.device_memory and work.checkpoint_activations is not None and setup.recompute is not False:
            saved = self.memory(setup, degrees, micro, recompute=True)
            if saved.total < est.total:
                est, compute = saved, compute * (8 / 6)  # one more forward pass
                notes.append("full recomputation")
        if pipeline > 1:
            compute *= (micro + pipeline - 1) / micro
            notes.append(f"{micro} micro-batches, bubble {(pipeline - 1) / (micro + pipeline - 1):.0%}")
        return PlanRow(strategy=self.name, layout=degrees._asdict(), memory=est, fits=est.total <= setup.device_memory,
                       comm_seconds=self.comm_seconds(setup, degrees, micro), compute_seconds=compute,
                       note="; ".join(notes))


LAYOUTS: Registry[ParallelLayout] = Registry("planned strategy")


def _layout(name: str, *, description: str,
            aliases: tuple[str, ...] = ()) -> Callable[[type[ParallelLayout]], type[ParallelLayout]]:
    def register(cls: type[ParallelLayout]) -> type[ParallelLayout]:
        cls.name = name
        LAYOUTS.register(name, cls(), description=description, aliases=aliases)
        return cls

    return register


def _gradient_all_reduce(setup: PlanSetup, d: Degrees) -> float:
    """Reduce-scatter + all-gather of the gradients (ZeRO 1 and 2 send the same); ZeRO 3 all-gathers the
    parameters once more: 3 instead of 2 passes over them."""
    nbytes = setup.all_reduced_gradient_bytes / (d.tensor * d.pipeline) * (1.5 if setup.zero == 3 else 1.0)
    return setup.all_reduce_seconds(nbytes, d.data, spans_nodes=True)


def _activation_all_reduce(setup: PlanSetup, d: Degrees) -> float:
    nbytes = setup.work.tensor_comm_values * (setup.batch_size / d.data) * setup.value_bytes / d.pipeline
    return setup.all_reduce_seconds(nbytes, d.tensor, spans_nodes=d.tensor > setup.per_node)


def _stage_transfers(setup: PlanSetup, d: Degrees, micro: int) -> float:
    if d.pipeline == 1:
        return 0.0
    across = d.pipeline * d.tensor > setup.per_node and setup.nodes > 1
    micro_examples = setup.batch_size / d.data / micro
    hop = (setup.inter if across else setup.intra).time(setup.work.boundary_values * micro_examples * setup.value_bytes)
    return 2 * (micro + d.pipeline - 1) * hop


class DataParallelLayout(ParallelLayout):
    """Every device holds a whole replica and a share of the batch."""

    def degrees(self, setup: PlanSetup) -> list[Degrees]:
        return [Degrees(setup.devices, 1, 1)]


@_layout("data_allreduce", aliases=("allreduce", "data_parallel"),
         description="Data parallel, gradients all-reduced (ring; two-level across machines).")
class DataAllReduceLayout(DataParallelLayout):
    def note(self, setup: PlanSetup) -> str:
        return ("ring all-reduce" + (" (two-level)" if setup.nodes > 1 else "")
                + (f"; ZeRO stage {setup.zero}" if setup.zero else "")
                + (f"; {setup.compression} gradients" if setup.compression else ""))

    def comm_seconds(self, setup: PlanSetup, degrees: Degrees, micro: int) -> float:
        return _gradient_all_reduce(setup, degrees)


@_layout("data_ps", aliases=("parameter_server", "ps"),
         description="Data parallel through parameter servers holding the weights and optimizer state.")
class ParameterServerLayout(DataParallelLayout):
    """Workers hold the weights they compute with, their gradients and activations; the servers
    hold the float32 weights and the optimizer state, which must fit the servers' memory. With one
    worker the gradients still go to the servers and the weights back every step: the only gain
    is the memory the servers take off the device."""

    def server_bytes(self, setup: PlanSetup) -> float:
        """What one server holds: float32 weights and optimizer state, sharded evenly."""
        per_param = bytes_per_parameter(setup.optimizer, "float32")
        return setup.work.parameters * (per_param["parameters"] + per_param["optimizer_state"]) / setup.ps_servers

    def memory(self, setup: PlanSetup, degrees: Degrees, micro: int, *, recompute: bool = False) -> MemoryEstimate:
        # The servers hold the optimizer state; workers keep whole weights and gradients (no ZeRO).
        unsharded = replace(setup, zero=0)
        return replace(super().memory(unsharded, degrees, micro, recompute=recompute), optimizer_state=0.0)

    def comm_seconds(self, setup: PlanSetup, degrees: Degrees, micro: int) -> float:
        return cost_model.predict_parameter_server(degrees.data, setup.ps_servers, setup.gradient_bytes,
                                                   setup.inter if setup.nodes > 1 else setup.intra)

    def cost_degrees(self, setup: PlanSetup, degrees: Degrees) -> PlanRow | str:
        row = super().cost_degrees(setup, degrees)
        if isinstance(row, str):
            return row
        held, capacity = self.server_bytes(setup), setup.server_capacity
        servers = f"{setup.ps_servers} parameter server{'s' if setup.ps_servers > 1 else ''}"
        notes = [f"{servers}, {format_bytes(held)} of {format_bytes(capacity)} each"
                 + ("" if setup.server_memory is not None else " (server memory not given: a device's)")]
        if held > capacity:
            notes.append("servers do not fit")
        if degrees.data == 1:
            notes.append("1 worker: the traffic buys only the memory the servers hold")
        notes += [row.note] if row.note else []
        return replace(row, fits=row.fits and held <= capacity, server_memory=held, note="; ".join(notes))


@_layout("tensor", aliases=("tensor_parallel",), description="Every weight sharded over all devices (Megatron-LM).")
class TensorParallelLayout(ParallelLayout):
    def degrees(self, setup: PlanSetup) -> list[Degrees]:
        return [Degrees(1, setup.devices, 1)]

    def comm_seconds(self, setup: PlanSetup, degrees: Degrees, micro: int) -> float:
        return _activation_all_reduce(setup, degrees)


@_layout("pipeline", aliases=("pipeline_parallel",),
         description="Layers split into one stage per device, 1F1B micro-batches.")
class PipelineLayout(ParallelLayout):
    def degrees(self, setup: PlanSetup) -> list[Degrees]:
        return [Degrees(1, 1, setup.devices)]

    def comm_seconds(self, setup: PlanSetup, degrees: Degrees, micro: int) -> float:
        return _stage_transfers(setup, degrees, micro)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@_layout("hybrid", description="Data x tensor (inside a machine) x pipeline.")
class HybridLayout(ParallelLayout):
    def degrees(self, setup: PlanSetup) -> list[Degrees]:
        """Every mix of at least two kinds, tensor parallelism inside one machine."""
        return [Degrees(setup.devices // (tensor * pipeline), tensor, pipeline)
                for tensor in _divisors(setup.per_node) for pipeline in _divisors(setup.devices // tensor)
                if (setup.devices // (tensor * pipeline), tensor, pipeline).count(1) < 2]

    def comm_seconds(self, setup: PlanSetup, degrees: Degrees, micro: int) -> float:
        return (_gradient_all_reduce(setup, degrees) + _activation_all_reduce(setup, degrees)
                + _stage_transfers(setup, degrees, micro))

    def cost(self, setup: PlanSetup) -> PlanRow | None:
        """The best hybrid; some mixes are always impossible, so none is reported as such."""
        best = super().cost(setup)
        return best if isinstance(best, PlanRow) else None
