"""The planner: which parallel layout fits a model on the devices at hand, and which is fastest.

For a model (a registered Keras model, or a transformer given by its parameter count: a
:class:`~tensorfleet.planner.workload.Workload`) and a cluster (devices, device memory,
bandwidth, machines), every layout of :data:`~tensorfleet.planner.layouts.LAYOUTS` (data
parallel by all-reduce or by a parameter server, tensor, pipeline, the best hybrid) is costed
for memory per device and time per step (:mod:`tensorfleet.planner.layouts` says how).

The recommendation is the fitting layout with the shortest step (compute + communication,
no overlap assumed).

Example:
    >>> from tensorfleet.planner import plans as planner
    >>> result = planner.plan(parameters=1.5e9, batch_size=32, devices=8, device_memory="80GB",
    ...                       bandwidth="100Gbps")
    >>> result.row("data_allreduce").memory.model_states / 1.5e9
    16.0
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from tensorfleet.planner.cost_model import Link
from tensorfleet.planner.layouts import LAYOUTS, PlanRow, PlanSetup
from tensorfleet.planner.memory import Optimizer, bytes_per_parameter, format_bytes, zero_bytes_per_parameter
from tensorfleet.planner.workload import (
    Workload,
    format_count,
    preset_workload,
    transformer_workload,
    workload_from_model,
)
from tensorfleet.validation import choice, integer, number, parse_bandwidth, parse_bytes, parse_duration, positive_int

__all__ = ["ModelShape", "Network", "ParameterServers", "Plan", "TrainingOptions", "plan"]


@dataclass(frozen=True)
class ModelShape:
    """A transformer's shape, for ``plan(parameters=...)`` (``layers``, ``hidden`` and ``heads``; ``hidden``
    and ``heads`` together) and ``plan(transformer=...)`` (``seq_len`` only). ``seq_len`` defaults to the
    known transformer's, or 1024 with ``parameters``."""

    seq_len: int | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None


@dataclass(frozen=True)
class Network:
    """How the devices are connected: ``nodes`` machines (``devices`` spread evenly over them), the links
    between devices of one machine (``intra_bandwidth``, default: ``plan``'s ``bandwidth``), and the
    per-message ``latency`` of every link."""

    nodes: int = 1
    intra_bandwidth: str | float | None = None
    latency: str | float = "5us"


@dataclass(frozen=True)
class TrainingOptions:
    """How the model trains: ``optimizer`` (``sgd``, ``momentum``, ``adam``), ``precision`` (``float32``,
    ``mixed_float16``, ``mixed_bfloat16``), ``recompute`` (full activation recomputation for a transformer:
    None = only for a strategy that does not fit without it, False = never) and the ZeRO stage ``zero``
    0-3 of the data-parallel replicas of every layout but ``data_ps`` (1 shards the optimizer state over
    them, 2 also the gradients, 3 also the parameters); ``compression`` of the gradients' all-reduce (``fp16``,
    ``bf16``, ``powersgd:rank=R``: the ``compression`` option of :mod:`tensorfleet.strategies.compression`)."""

    optimizer: str = "adam"
    precision: str = "mixed_float16"
    recompute: bool | None = None
    zero: int = 0
    compression: str | None = None


@dataclass(frozen=True)
class ParameterServers:
    """The ``data_ps`` layout's parameter servers (hosts besides the devices): how many, and the memory of
    one (default: as much as a device, said so in the row's note)."""

    count: int = 1
    memory: str | float | None = None


def _options(name: str, value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise ValueError(f"{name} must be a tensorfleet.planner.plans.{kind.__name__}. Received: {name}={value!r}")
    return value


@dataclass
class Plan:
    """All layouts costed, and the recommendation."""

    workload: Workload
    inputs: dict[str, Any]
    rows: list[PlanRow] = field(default_factory=list)
    recommendation: str = ""
    reason: str = ""
    impossible: dict[str, str] = field(default_factory=dict)

    def row(self, strategy: str) -> PlanRow:
        name = LAYOUTS.canonical(strategy)
        found = next((r for r in self.rows if r.strategy == name), None)
        if found is None:
            raise ValueError(f"The plan has no {name} row: {self.impossible.get(name, 'not costed')}. Received: "
                             f"strategy={strategy!r}")
        return found

    def mesh(self, strategy: str | None = None, *, devices: Sequence[str] | None = None) -> Any:
        """The recommended layout (or ``strategy``'s row) as a :class:`~tensorfleet.planner.runs.PlannedMesh`:
        a :class:`~tensorfleet.model_parallel.mesh.Mesh` with the row's degrees as mesh dimensions, its layout
        rules and the plan's ZeRO stage, over the local devices (or ``devices``). Build and compile a model in
        its ``scope()``, ``fit`` it, then ``mesh.report()`` sets what the run holds beside this plan.
        A pipeline or a parameter-server row is one :class:`~tensorfleet.planner.runs.NotAMeshError`."""
        from tensorfleet.planner.runs import PlannedMesh

        return PlannedMesh(self.as_dict(), self.row(strategy or self.recommendation).strategy, devices=devices)

    def run(self, script: str | os.PathLike[str], args: Sequence[str] = (), *, strategy: str | None = None,
            report: str | os.PathLike[str] = "plan_report.json", timeout: float | None = None,
            processes: int = 1) -> Any:
        """Runs ``script`` in a new process under :meth:`mesh` (its ``tfl.planner.planned_mesh()``), or in
        ``processes`` launched processes the mesh spans, and returns the
        :class:`~tensorfleet.planner.run_report.RunReport`, also written to ``report`` (JSON) and beside it
        as a PNG. ``tensorfleet plan ... --run script.py [--run-processes N]`` is the same."""
        from tensorfleet.planner.runs import run_script

        name = self.row(strategy or self.recommendation).strategy
        return run_script(self.as_dict(), name, script, args, report=report, timeout=timeout, processes=processes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.workload.name,
            "parameters": self.workload.parameters,
            "shape": None if self.workload.shape is None else {
                **asdict(self.workload.shape), "seq_len_planned": self.workload.seq_len,
                "assumed": self.workload.shape_assumed},
            "inputs": self.inputs,
            "strategies": [r.as_dict() for r in self.rows],
            "impossible": self.impossible,
            "recommendation": self.recommendation,
            "reason": self.reason,
        }

    def table(self) -> str:
        """A plain-text table, one strategy per line, then the recommendation."""
        header = (f"{'strategy':<16} {'layout':<22} {'memory/device':>14} {'fits':>5} {'comm/step':>11} {'step':>11}  "
                  "note")
        shape = self.workload.describe_shape()
        title = f"{self.workload.name}: {format_count(self.workload.parameters)} parameters" + (
            f" ({shape})" if shape else "")
        lines = [title, header, "-" * len(header)]
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


def plan(
    model: str | None = None,
    *,
    parameters: float | None = None,
    transformer: str | None = None,
    shape: ModelShape = ModelShape(),
    batch_size: int,
    devices: int,
    device_memory: str | float,
    bandwidth: str | float,
    device_tflops: float = 100.0,
    network: Network = Network(),
    training: TrainingOptions = TrainingOptions(),
    servers: ParameterServers = ParameterServers(),
) -> Plan:
    """Costs every layout of ``LAYOUTS`` for a model on ``devices`` devices and recommends one.

    Sizes, bandwidths and latencies given as strings need a unit (``"100"`` is refused: bytes/s
    or Gbps?); numbers are bytes, bytes/s and seconds.

    Args:
        model: a registered model name (``tensorfleet.models``); or instead:
        parameters: a transformer's parameter count (e.g. ``1.5e9``), with ``shape``'s ``layers``,
            ``hidden`` and ``heads`` if known; or instead:
        transformer: a known transformer of :data:`~tensorfleet.planner.workload.TRANSFORMERS`
            (``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``, ``gpt3-175b``, ``bert-base``,
            ``bert-large``), with its real shape and parameter count.
        shape: the transformer's shape (:class:`ModelShape`).
        batch_size: global batch (sequences for a transformer).
        devices: devices in all, spread evenly over ``network.nodes`` machines.
        device_memory: memory of one device, e.g. ``"16GB"``.
        bandwidth: the network between machines (between devices when there is one machine), e.g.
            ``"100Gbps"``.
        device_tflops: sustained TFLOP/s of one device, for compute time.
        network: machines, links inside one, latency (:class:`Network`).
        training: optimizer, precision, recomputation, ZeRO stage (:class:`TrainingOptions`).
        servers: the parameter servers of the ``data_ps`` layout (:class:`ParameterServers`).

    Returns:
        A :class:`Plan`. Raises ValueError when no layout fits, saying how much is missing and
        what could help with the settings given.

    Example:
        >>> print(plan("digits_cnn", batch_size=256, devices=4, device_memory="16GB",
        ...            bandwidth="10Gbps").table())
        digits_cnn: 38.282K parameters
        strategy         layout                  memory/device  fits   comm/step        step  note
        ------------------------------------------------------------------------------------------
        data_allreduce   d=4 t=1 p=1                   1.15 MB   yes    0.122 ms    0.122 ms  ring all-reduce
        data_ps          d=4 t=1 p=1                 695.08 KB   yes    0.500 ms    0.500 ms  1 parameter server, 459.38 KB of 16.00 GB each (server memory not given: a device's)
        tensor           d=1 t=4 p=1                 695.08 KB   yes    3.896 ms    3.896 ms
        pipeline         d=1 t=1 p=4                 529.41 KB   yes    2.182 ms    2.182 ms  16 micro-batches, bubble 16%
        hybrid           d=2 t=1 p=2                 538.08 KB   yes    1.074 ms    1.075 ms  8 micro-batches, bubble 11%
        recommendation: data_allreduce -- fits (1.15 MB of 16.00 GB per device) with the shortest
        estimated step, 0.122 ms (0.122 ms communication); next: data_ps at 0.500 ms
    """  # noqa: E501  (the table as plan().table() prints it)
    shape, network = _options("shape", shape, ModelShape), _options("network", network, Network)
    training, servers = _options("training", training, TrainingOptions), _options("servers", servers, ParameterServers)
    batch_size = positive_int("batch_size", batch_size)
    devices = positive_int("devices", devices)
    nodes = positive_int("nodes", network.nodes)
    ps_servers = positive_int("servers.count", servers.count)
    zero = integer("zero", training.zero, minimum=0, maximum=3)
    compression = _compression(training.compression, zero)
    if devices % nodes:
        raise ValueError(f"devices must be a multiple of nodes. Received: devices={devices}, nodes={nodes}")
    number("device_tflops", device_tflops, above=0)
    memory_bytes = _positive_bytes("device_memory", device_memory)
    servers_bytes = None if servers.memory is None else _positive_bytes("servers.memory", servers.memory)
    alpha = parse_duration(network.latency, require_unit=True)
    inter = Link(alpha=alpha, beta=1.0 / parse_bandwidth(bandwidth, require_unit=True))
    intra = inter if network.intra_bandwidth is None else Link(
        alpha=alpha, beta=1.0 / parse_bandwidth(network.intra_bandwidth, require_unit=True))
    work = _workload(model, parameters, transformer, seq_len=shape.seq_len, layers=shape.layers, hidden=shape.hidden,
                     heads=shape.heads)
    optimizer, precision = training.optimizer, training.precision
    setup = PlanSetup(work=work, batch_size=batch_size, devices=devices, nodes=nodes, device_memory=memory_bytes,
                      intra=intra, inter=inter, device_tflops=device_tflops, optimizer=optimizer, precision=precision,
                      value_bytes=bytes_per_parameter(optimizer, precision)["parameters"],  # also checks both
                      recompute=training.recompute, ps_servers=ps_servers, server_memory=servers_bytes, zero=zero,
                      compression=compression)
    result = Plan(workload=work, inputs=setup.inputs())
    for entry in LAYOUTS.entries():
        costed = entry.obj.cost(setup)
        if isinstance(costed, PlanRow):
            result.rows.append(costed)
        elif costed:
            result.impossible[entry.name] = costed
    return _recommend(result, setup)


def _compression(value: str | None, zero: int) -> str | None:
    from tensorfleet.strategies.compression import GradientCompression, parse_compression

    spec = parse_compression(value)
    if spec is not None and spec.method is GradientCompression.POWERSGD and zero:
        raise ValueError(f"compression={str(spec)!r} sends low-rank factors that a ZeRO reduce-scatter cannot "
                         f"shard. Received: compression={value!r}, zero={zero}; use zero=0, or compression='fp16'.")
    return None if spec is None else str(spec)


def _positive_bytes(name: str, value: str | float) -> float:
    nbytes = parse_bytes(value, require_unit=True)
    if nbytes <= 0:  # parse_bytes takes 0; the message echoes what the user wrote
        raise ValueError(f"{name} must be positive. Received: {name}={value!r}")
    return nbytes


def _workload(model: str | None, parameters: float | None, transformer: str | None, *, seq_len: int | None,
              layers: int | None, hidden: int | None, heads: int | None) -> Workload:
    """The workload of exactly one of a Keras model, a parameter count or a known transformer."""
    given = {k: v for k, v in (("model", model), ("parameters", parameters), ("transformer", transformer))
             if v is not None}
    if len(given) != 1:
        raise ValueError("Give exactly one of model (a registered Keras model), parameters (a transformer's "
                         f"count) or transformer (a known one). Received: model={model!r}, "
                         f"parameters={parameters!r}, transformer={transformer!r}")
    shape = {k: v for k, v in (("seq_len", seq_len), ("layers", layers), ("hidden", hidden), ("heads", heads))
             if v is not None}
    if model is not None:
        if shape:
            raise ValueError(f"{', '.join(shape)} describe{'s' if len(shape) == 1 else ''} a transformer "
                             "(parameters= or transformer=); a Keras "
                             f"model has its own shape. Received: model={model!r}, "
                             + ", ".join(f"{k}={v!r}" for k, v in shape.items()))
        return workload_from_model(model)
    if transformer is not None:
        fixed = {k: v for k, v in shape.items() if k != "seq_len"}
        if fixed:
            raise ValueError(f"transformer={transformer!r} fixes layers, hidden and heads; for another shape "
                             "give parameters= with them. Received: "
                             + ", ".join(f"{k}={v!r}" for k, v in fixed.items()))
        return preset_workload(transformer, seq_len=seq_len)
    assert parameters is not None  # exactly one of the three was given, and neither model nor transformer
    return transformer_workload(parameters, layers=layers, hidden=hidden, heads=heads,
                                seq_len=1024 if seq_len is None else seq_len)


def _advice(setup: PlanSetup, rows: list[PlanRow]) -> str:
    """What could make the model fit, from the settings given (none that are already in use)."""
    work, optimizer = setup.work, choice(Optimizer, "optimizer", setup.optimizer).value
    per_param = bytes_per_parameter(optimizer, setup.precision)
    states = sum(per_param.values()) * work.parameters
    needed = math.ceil(states / setup.device_memory)
    tips = [f"at least {needed} devices of this memory (the model states alone are {format_bytes(states)})"
            if needed > setup.devices else "more devices"]
    if setup.zero < 3 and setup.devices > 1:
        sharded = sum(zero_bytes_per_parameter(optimizer, setup.precision, zero=3, replicas=setup.devices).values())
        tips.append(f"ZeRO stage 3 (zero=3), which shards the model states over data-parallel replicas "
                    f"({format_bytes(sharded * work.parameters)} per device on {setup.devices})")
    if setup.value_bytes == 4:
        tips.append(f"mixed precision, which halves the activations (not the model states: {optimizer} "
                    f"keeps {sum(per_param.values())} bytes per parameter either way)")
    lighter = [(o, sum(bytes_per_parameter(o, setup.precision).values())) for o in ("momentum", "sgd")]
    lighter = [(o, b) for o, b in lighter if b < sum(per_param.values())]
    if lighter:
        tips.append(f"an optimizer with less state than {optimizer}: "
                    + " or ".join(f"{o} ({b} bytes per parameter)" for o, b in lighter))
    if setup.batch_size > 1 and any(r.memory.activations for r in rows):
        tips.append("a smaller batch")
    if setup.recompute is False and work.checkpoint_activations is not None:
        tips.append("activation recomputation (recompute=None)")
    short = [r.server_memory for r in rows if r.server_memory is not None and r.server_memory > setup.server_capacity
             and r.memory.total <= setup.device_memory]  # the servers are all that does not fit
    if short:
        tips.append(f"more parameter servers or more memory on them ({format_bytes(short[0])} each "
                    f"needed with {setup.ps_servers})")
    return "What could help: " + "; ".join(tips) + "."


def _recommend(result: Plan, setup: PlanSetup) -> Plan:
    """Fills in the fitting layout with the shortest step, or says how much memory is missing."""
    rows, work, memory_bytes = result.rows, setup.work, setup.device_memory
    fitting = [r for r in rows if r.fits]
    if not fitting:
        # A parameter-server row may fit its workers and not its servers; the advice says so.
        short = [r for r in rows if r.memory.total > memory_bytes] or rows
        smallest = min(short, key=lambda r: r.memory.total)
        raise ValueError(
            f"{work.name} ({format_count(work.parameters)} parameters, batch {setup.batch_size}) fits nowhere on "
            f"{setup.devices} device(s) of {format_bytes(memory_bytes)}: the smallest need is "
            f"{format_bytes(smallest.memory.total)} per device ({smallest.strategy}), "
            f"{format_bytes(smallest.memory.total - memory_bytes)} missing. " + _advice(setup, rows)
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
