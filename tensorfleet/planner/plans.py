"""The planner: which parallel strategy fits a model on the devices at hand, and which is fastest.

For a model (a registered Keras model, or a transformer given by its parameter count) and a
cluster (devices, device memory, bandwidth, machines), every strategy is costed:

* memory per device from :mod:`tensorfleet.planner.memory` (ZeRO's model-state accounting,
  activations per micro-batch);
* communication per step from the alpha-beta model of :mod:`tensorfleet.planner.cost_model`:
  data parallel all-reduces the gradients (ring; two-level when there are several machines)
  or pushes and pulls them through one parameter server; tensor parallelism all-reduces
  activations (Megatron-LM: 4 per transformer layer per step); a pipeline sends activations
  and their gradients between neighbouring stages once per micro-batch;
* compute per step as ``6 x parameters x tokens / (devices x device FLOP/s)`` (Kaplan et al.
  2020), stretched by the pipeline bubble ``(P-1) / (m+P-1)`` (Huang et al., GPipe, 2019).

The recommendation is the fitting strategy with the shortest step (compute + communication,
no overlap assumed). A transformer given only by its parameter count gets a GPT-3-like shape
(``12 L h^2 = N``, ``h = 128 L``, 128-wide heads) unless layers and hidden size are given;
its activations follow Korthikanti et al. 2022 (``s h (34 + 5 a s / h)`` bytes per layer and
example at 16 bits).

Example:
    >>> from tensorfleet.planner import plans as planner
    >>> result = planner.plan(parameters=1.5e9, batch_size=32, devices=8, device_memory="80GB",
    ...                       bandwidth="100Gbps")
    >>> result.row("data_allreduce").memory.model_states / 1.5e9
    16.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tensorfleet.registry import Registry
from tensorfleet.planner import cost_model
from tensorfleet.validation import parse_bandwidth, parse_bytes, parse_duration
from tensorfleet.planner.memory import (
    MemoryEstimate,
    bytes_per_parameter,
    estimate_from_counts,
    format_bytes,
    layer_table,
    split_stages,
)

__all__ = [
    "Plan",
    "PlanRow",
    "STRATEGIES",
    "Workload",
    "plan",
    "transformer_workload",
    "workload_from_model",
]

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
    if isinstance(parameters, bool) or not isinstance(parameters, (int, float)) or not parameters > 0:
        raise ValueError(f"parameters must be a positive number. Received: parameters={parameters!r}")
    for key, value in (("layers", layers), ("hidden", hidden)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{key} must be a positive integer. Received: {key}={value!r}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer. Received: seq_len={seq_len!r}")
    if layers is None and hidden is None:
        layers = max(1, round((parameters / (12 * 128**2)) ** (1 / 3)))
    if hidden is None:
        hidden = max(1, round(math.sqrt(parameters / (12 * layers))))
    if layers is None:
        layers = max(1, round(parameters / (12 * hidden**2)))
    heads = max(1, hidden // 128)
    per_layer_acts = seq_len * (34 * hidden + 5 * heads * seq_len) / 2  # 16-bit bytes / 2 = values
    return Workload(
        name=name or f"transformer-{_short(parameters)}",
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


def _short(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


@dataclass
class PlanRow:
    """One strategy's layout, memory per device and time per step."""

    strategy: str
    layout: dict[str, int]
    memory: MemoryEstimate
    fits: bool
    comm_seconds: float
    compute_seconds: float
    note: str = ""

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
        }


@dataclass
class Plan:
    """All strategies costed, and the recommendation."""

    workload: Workload
    inputs: dict[str, Any]
    rows: list[PlanRow] = field(default_factory=list)
    recommendation: str = ""
    reason: str = ""
    impossible: dict[str, str] = field(default_factory=dict)

    def row(self, strategy: str) -> PlanRow:
        name = STRATEGIES.canonical(strategy)
        return next(r for r in self.rows if r.strategy == name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.workload.name,
            "parameters": self.workload.parameters,
            "inputs": self.inputs,
            "strategies": [r.as_dict() for r in self.rows],
            "impossible": self.impossible,
            "recommendation": self.recommendation,
            "reason": self.reason,
        }

    def table(self) -> str:
        """A plain-text table, one strategy per line, then the recommendation."""
        header = f"{'strategy':<16} {'layout':<22} {'memory/device':>14} {'fits':>5} {'comm/step':>11} {'step':>11}  note"
        lines = [f"{self.workload.name}: {_short(self.workload.parameters)} parameters", header, "-" * len(header)]
        for r in self.rows:
            layout = " ".join(f"{k[0]}={v}" for k, v in r.layout.items())
            lines.append(
                f"{r.strategy:<16} {layout:<22} {format_bytes(r.memory.total):>14} {'yes' if r.fits else 'no':>5} "
                f"{_ms(r.comm_seconds):>11} {_ms(r.step_seconds):>11}  {r.note}"
            )
        for strategy, why in self.impossible.items():
            lines.append(f"{strategy:<16} not possible: {why}")
        lines.append(f"recommendation: {self.recommendation} -- {self.reason}")
        return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 10 else f"{seconds:.1f} s"


STRATEGIES: Registry[str] = Registry("planned strategy")
STRATEGIES.register("data_allreduce", "data", aliases=("allreduce", "data_parallel"),
                    description="Data parallel, gradients all-reduced (ring; two-level across machines).")
STRATEGIES.register("data_ps", "data", aliases=("parameter_server", "ps"),
                    description="Data parallel through one parameter server holding the optimizer state.")
STRATEGIES.register("tensor", "tensor", aliases=("tensor_parallel",),
                    description="Every weight sharded over all devices (Megatron-LM).")
STRATEGIES.register("pipeline", "pipeline", aliases=("pipeline_parallel",),
                    description="Layers split into one stage per device, 1F1B micro-batches.")
STRATEGIES.register("hybrid", "hybrid", description="Data x tensor (inside a machine) x pipeline.")


def _suggest_micro_batches(batch: int, stages: int) -> int:
    """The smallest divisor of ``batch`` of at least 4 x stages (bubble <= 20%), else ``batch``."""
    for m in range(min(4 * stages, batch), batch + 1):
        if batch % m == 0:
            return m
    return batch


def _int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer. Received: {key}={value!r}")
    return value


def plan(
    model: str | None = None,
    *,
    parameters: float | None = None,
    batch_size: int,
    devices: int,
    device_memory: str | float,
    bandwidth: str | float,
    nodes: int = 1,
    intra_bandwidth: str | float | None = None,
    latency: str | float = "5us",
    device_tflops: float = 100.0,
    optimizer: str = "adam",
    precision: str = "mixed_float16",
    seq_len: int = 1024,
    layers: int | None = None,
    hidden: int | None = None,
    recompute: bool | None = None,
) -> Plan:
    """Costs every strategy for a model on ``devices`` devices and recommends one.

    Args:
        model: a registered model name (``tensorfleet.models``), or None with ``parameters``.
        parameters: a transformer's parameter count (e.g. ``1.5e9``), instead of ``model``.
        batch_size: global batch (sequences for a transformer).
        devices: devices in all, spread evenly over ``nodes`` machines.
        device_memory: memory of one device, e.g. ``"16GB"``.
        bandwidth: the network between machines (between devices when ``nodes == 1``), e.g.
            ``"100Gbps"``.
        nodes: machines.
        intra_bandwidth: links between devices of one machine (default: ``bandwidth``).
        latency: per-message latency of every link.
        device_tflops: sustained TFLOP/s of one device, for compute time.
        optimizer: ``sgd``, ``momentum`` or ``adam``.
        precision: ``float32``, ``mixed_float16`` or ``mixed_bfloat16``.
        seq_len, layers, hidden: the transformer's shape (``parameters`` only).
        recompute: full activation recomputation for a transformer: None = only for a
            strategy that does not fit without it, False = never.

    Returns:
        A :class:`Plan`. Raises ValueError when no strategy fits, saying how much is missing.

    Example:
        >>> print(plan("digits_cnn", batch_size=256, devices=4, device_memory="16GB",
        ...            bandwidth="10Gbps").table())
        digits_cnn: 38.282K parameters
        strategy         layout                  memory/device  fits   comm/step        step  note
        ------------------------------------------------------------------------------------------
        data_allreduce   d=4 t=1 p=1                   1.15 MB   yes    0.122 ms    0.122 ms  ring all-reduce
        data_ps          d=4 t=1 p=1                 695.08 KB   yes    0.500 ms    0.500 ms  1 parameter server
        tensor           d=1 t=4 p=1                 695.08 KB   yes    3.896 ms    3.896 ms
        pipeline         d=1 t=1 p=4                 529.41 KB   yes    2.182 ms    2.182 ms  16 micro-batches, bubble 16%
        hybrid           d=2 t=1 p=2                 538.08 KB   yes    1.074 ms    1.075 ms  8 micro-batches, bubble 11%
        recommendation: data_allreduce -- fits (1.15 MB of 16.00 GB per device) with the shortest
        estimated step, 0.122 ms (0.122 ms communication); next: data_ps at 0.500 ms
    """
    if (model is None) == (parameters is None):
        raise ValueError(f"Give exactly one of model (a name) or parameters (a count). Received: model={model!r}, "
                         f"parameters={parameters!r}")
    batch_size = _int("batch_size", batch_size)
    devices = _int("devices", devices)
    nodes = _int("nodes", nodes)
    if devices % nodes:
        raise ValueError(f"devices must be a multiple of nodes. Received: devices={devices}, nodes={nodes}")
    if isinstance(device_tflops, bool) or not isinstance(device_tflops, (int, float)) or not device_tflops > 0:
        raise ValueError(f"device_tflops must be positive. Received: device_tflops={device_tflops!r}")
    memory_bytes = parse_bytes(device_memory)
    if memory_bytes <= 0:
        raise ValueError(f"device_memory must be positive. Received: device_memory={device_memory!r}")
    alpha = parse_duration(latency)
    inter = cost_model.Link(alpha=alpha, beta=1.0 / parse_bandwidth(bandwidth))
    intra = inter if intra_bandwidth is None else cost_model.Link(
        alpha=alpha, beta=1.0 / parse_bandwidth(intra_bandwidth))
    work = (workload_from_model(model) if model is not None
            else transformer_workload(parameters, layers=layers, hidden=hidden, seq_len=seq_len))  # type: ignore[arg-type]
    per_node = devices // nodes
    value_bytes = bytes_per_parameter(optimizer, precision)["parameters"]  # also validates both
    flops = device_tflops * 1e12
    inputs = {"batch_size": batch_size, "devices": devices, "nodes": nodes, "device_memory_bytes": memory_bytes,
              "bandwidth_bytes_per_s": inter.bandwidth, "intra_bandwidth_bytes_per_s": intra.bandwidth,
              "latency_s": alpha, "device_tflops": device_tflops, "optimizer": optimizer, "precision": precision,
              "recompute": recompute}

    def allreduce(nbytes: float, group: int, spans_nodes: bool) -> float:
        if group == 1:
            return 0.0
        if spans_nodes and nodes > 1 and group % nodes == 0:
            return cost_model.predict_hierarchical(nodes, group // nodes, nbytes, intra=intra, inter=inter)
        return cost_model.predict("ring", group, nbytes, inter if spans_nodes and nodes > 1 else intra)

    def memory(data: int, tensor: int, pipeline: int, micro: int, strategy: str,
               recompute: bool = False) -> MemoryEstimate:
        groups = split_stages([max(p, 1e-9) for p in work.layer_parameters], pipeline)
        stage_params = [sum(work.layer_parameters[i] for i in g) for g in groups]
        kept = work.checkpoint_activations if recompute and work.checkpoint_activations else work.layer_activations
        stage_acts = [sum(kept[i] for i in g) for g in groups]
        parallelism = {(1, 1): "data"}.get((tensor, pipeline), "hybrid")
        est = estimate_from_counts(
            stage_parameters=stage_params, stage_activation_values=stage_acts, batch_size=batch_size,
            optimizer=optimizer, precision=precision, parallelism=parallelism, devices=data * tensor * pipeline,
            tensor=tensor, micro_batches=micro)
        extra = 0.0
        if recompute:  # the one layer being recomputed holds its full activations
            extra = max(work.layer_activations) * est.micro_batch * value_bytes / tensor
        if strategy == "data_ps" or extra:  # a parameter server keeps the optimizer state, not workers
            est = MemoryEstimate(parameters=est.parameters, gradients=est.gradients,
                                 optimizer_state=0.0 if strategy == "data_ps" else est.optimizer_state,
                                 activations=est.activations + extra, parallelism=est.parallelism,
                                 devices=est.devices, micro_batch=est.micro_batch)
        return est

    compute_all = work.flops_per_example * batch_size / (devices * flops)
    grad_bytes = work.parameters * value_bytes
    rows: list[PlanRow] = []

    impossible: dict[str, str] = {}

    def add(strategy: str, data: int, tensor: int, pipeline: int, note: str = "") -> None:
        if batch_size % data:
            impossible[strategy] = f"batch {batch_size} does not split over {data} replicas"
            return
        if pipeline > len(work.layer_parameters):
            impossible[strategy] = f"{pipeline} stages but only {len(work.layer_parameters)} layers"
            return
        micro = _suggest_micro_batches(batch_size // data, pipeline) if pipeline > 1 else 1
        est = memory(data, tensor, pipeline, micro, strategy)
        comm = 0.0
        compute = compute_all
        if est.total > memory_bytes and work.checkpoint_activations is not None and recompute is not False:
            saved = memory(data, tensor, pipeline, micro, strategy, recompute=True)
            if saved.total < est.total:
                est = saved
                compute *= 8 / 6  # one more forward pass
                note = (note + "; " if note else "") + "full recomputation"
        if strategy == "data_ps":
            comm = cost_model.predict("ps", data, grad_bytes, inter if nodes > 1 else intra)
        elif data > 1:
            comm += allreduce(grad_bytes / (tensor * pipeline), data, spans_nodes=True)
        if tensor > 1:
            per_replica = batch_size / data
            comm += allreduce(work.tensor_comm_values * per_replica * value_bytes / pipeline, tensor,
                              spans_nodes=tensor > per_node)
        if pipeline > 1:
            micro_examples = batch_size / data / micro
            hop = (inter if pipeline * tensor > per_node and nodes > 1 else intra).time(
                work.boundary_values * micro_examples * value_bytes)
            comm += 2 * (micro + pipeline - 1) * hop
            compute *= (micro + pipeline - 1) / micro
            bubble = (pipeline - 1) / (micro + pipeline - 1)
            note = (note + "; " if note else "") + f"{micro} micro-batches, bubble {bubble:.0%}"
        layout = {"data": data, "tensor": tensor, "pipeline": pipeline}
        rows.append(PlanRow(strategy=strategy, layout=layout, memory=est, fits=est.total <= memory_bytes,
                            comm_seconds=comm, compute_seconds=compute, note=note))

    add("data_allreduce", devices, 1, 1, "ring all-reduce" + (" (two-level)" if nodes > 1 else ""))
    add("data_ps", devices, 1, 1, "1 parameter server")
    add("tensor", 1, devices, 1)
    add("pipeline", 1, 1, devices)
    best_hybrid: PlanRow | None = None
    for tensor in _divisors(per_node):
        for pipeline in _divisors(devices // tensor):
            data = devices // (tensor * pipeline)
            if (data, tensor, pipeline).count(1) >= 2:
                continue  # a pure strategy, already above
            before = len(rows)
            add("hybrid", data, tensor, pipeline)
            if len(rows) > before:
                candidate = rows.pop()
                if best_hybrid is None or (candidate.fits, -candidate.step_seconds) > (best_hybrid.fits,
                                                                                         -best_hybrid.step_seconds):
                    best_hybrid = candidate
    if best_hybrid is not None:
        rows.append(best_hybrid)
    impossible.pop("hybrid", None)  # some hybrid layouts always remain, or none is listed
    result = Plan(workload=work, inputs=inputs, rows=rows, impossible=impossible)
    fitting = [r for r in rows if r.fits]
    if not fitting:
        smallest = min(rows, key=lambda r: r.memory.total)
        raise ValueError(
            f"{work.name} ({_short(work.parameters)} parameters, batch {batch_size}) fits nowhere on {devices} "
            f"device(s) of {format_bytes(memory_bytes)}: the smallest need is {format_bytes(smallest.memory.total)} "
            f"per device ({smallest.strategy}), {format_bytes(smallest.memory.total - memory_bytes)} missing. "
            "Add devices, use mixed precision, a smaller batch or a lighter optimizer."
        )
    best = min(fitting, key=lambda r: r.step_seconds)
    others = sorted((r for r in fitting if r is not best), key=lambda r: r.step_seconds)
    runner_up = f"; next: {others[0].strategy} at {_ms(others[0].step_seconds)}" if others else ""
    result.recommendation = best.strategy
    result.reason = (
        f"fits ({format_bytes(best.memory.total)} of {format_bytes(memory_bytes)} per device) with the shortest "
        f"estimated step, {_ms(best.step_seconds)} ({_ms(best.comm_seconds)} communication){runner_up}"
        + ("" if len(fitting) == len(rows) else
           f"; does not fit: {', '.join(r.strategy for r in rows if not r.fits)}")
    )
    return result


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
