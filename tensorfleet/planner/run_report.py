"""What a run on a plan's mesh holds per device, beside what the plan predicted: the cost model's error.

Three columns, per device:

* **plan**: the plan row's memory of the fullest device (:mod:`tensorfleet.planner.memory`: every weight
  split over the tensor-parallel devices, Megatron-LM's picture) and its step time;
* **layout**: the planner's model states weight by weight as the mesh actually laid the run's weights
  out (:func:`tensorfleet.planner.splits.model_state_bytes`: a rule leaves a weight whole when the mesh
  dimension does not divide it), with the plan's optimizer and precision;
* **measured**: the bytes of every shard of the run's weights and optimizer variables, per device, as
  ``dtensor.unpack`` returns them from the variables themselves; and the median wall time of a training
  step (the first step of every ``fit``, which traces, left out).

Gradients and activations live only inside a step: the plan predicts them, the report says so and
measures neither. On float32 plans of the model the run trains, the parameters and the optimizer state
(Adam's two slots; its iteration counter and learning rate are the ``counters`` row, outside the plan)
agree with the layout column to the byte. Mixed precision in the plan counts 16-bit weights and 32-bit
master weights that Keras does not keep as variables (it keeps float32 variables and casts in each step).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tensorfleet.planner.memory import format_bytes

__all__ = ["KINDS", "RunReport", "measure", "merge"]

KINDS = ("parameters", "optimizer_state", "optimizer_counters")


@dataclass
class RunReport:
    """The plan's prediction and the run's measurement, per device (bytes) and per step (seconds)."""

    strategy: str
    layout: dict[str, int]
    mesh_shape: str
    rules: str
    zero: int
    devices: list[str]
    planned: dict[str, Any]
    measured: dict[str, list[int]]
    by_layout: dict[str, float] | None = None
    step_seconds: float | None = None
    steps: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    run_parameters: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunReport:
        return cls(**data)

    def held(self, kind: str) -> int:
        """The most any device holds of ``kind`` (``parameters``, ``optimizer_state``, ``optimizer_counters``)."""
        return max(self.measured[kind])

    def table(self) -> str:
        """Predicted and measured side by side, one quantity a line."""
        p, degrees = self.planned, " ".join(f"{k[0]}={v}" for k, v in self.layout.items())
        lines = [f"plan: {self.strategy} ({degrees}) as mesh {self.mesh_shape!r}, rules {self.rules!r}, ZeRO "
                 f"{self.zero}; {len(self.devices)} devices; {p['optimizer']}, {p['precision']}",
                 f"{'per device':<18} {'plan':>12} {'layout':>12} {'measured':>12} {'measured/plan':>14}"]
        for kind, name in (("parameters", "parameters"), ("gradients", "gradients"),
                           ("optimizer_state", "optimizer state"), ("optimizer_counters", "  counters"),
                           ("activations", "activations")):
            planned = p.get(kind)
            layout = None if self.by_layout is None else self.by_layout.get(kind)
            held = self.held(kind) if kind in self.measured else None
            ratio = f"{held / planned:.3f}" if held is not None and planned else ""
            note = "" if held is not None else "  (only inside a step: not measured)"
            lines.append(f"{name:<18} {_size(planned):>12} {_size(layout):>12} {_size(held):>12} {ratio:>14}{note}")
        measured = "-" if self.step_seconds is None else f"{self.step_seconds * 1e3:.3f} ms"
        ratio = f"{self.step_seconds / p['step_seconds']:.3g}" if self.step_seconds and p["step_seconds"] else ""
        batch = ", ".join(str(b) for b in sorted(set(self.batch_sizes))) or "not given to fit"
        lines.append(f"{'step':<18} {p['step_seconds'] * 1e3:>9.3f} ms {'':>12} {measured:>12} {ratio:>14}"
                     f"  (median of {self.steps} steps; batch {batch}, the plan's {p['batch_size']})")
        if any(len(set(v)) > 1 for v in self.measured.values()):
            for kind in KINDS:
                lines.append(f"  {kind} by device: " + ", ".join(
                    f"{_short(d)} {format_bytes(b)}" for d, b in zip(self.devices, self.measured[kind])))
        if self.run_parameters != p["model_parameters"]:
            lines.append(f"note: the run's models have {self.run_parameters:,} parameters, the plan's "
                         f"{p['model']} {int(p['model_parameters']):,}")
        return "\n".join(lines)

    def plot(self, path: str | Path) -> Path:
        """A PNG: per device, the plan's, the layout's and the measured parameters + optimizer state."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from tensorfleet.io import save_figure

        fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(self.devices)), 3.6))
        xs = range(len(self.devices))
        states = ("parameters", "optimizer_state")
        planned = sum(self.planned[k] for k in states)
        bars = [("plan", [planned] * len(self.devices), -0.27)]
        if self.by_layout is not None:
            bars.append(("layout", [sum(self.by_layout[k] for k in states)] * len(self.devices), 0.0))
        bars.append(("measured", [sum(self.measured[k][i] for k in states) for i in xs], 0.27))
        for label, values, offset in bars:
            ax.bar([x + offset for x in xs], values, width=0.26, label=label)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([_short(d) for d in self.devices])
        ax.set_ylabel("parameters + optimizer state (bytes)")
        step = "" if self.step_seconds is None else (
            f"; step plan {self.planned['step_seconds'] * 1e3:.3g} ms, measured {self.step_seconds * 1e3:.3g} ms")
        ax.set_title(f"{self.strategy} on {self.mesh_shape}{step}", fontsize=10)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
        return save_figure(fig, path)


def _size(value: float | None) -> str:
    return "-" if value is None else format_bytes(value)


def _short(device: str) -> str:
    return device.rsplit("device:", 1)[-1]


def _per_device(variables: list[Any], devices: list[str]) -> list[int]:
    """Bytes of the shards of ``variables`` on each device, from the variables themselves."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    def where(device: str) -> tuple[int, str, int]:  # a process's devices are those of its task
        spec = tf.DeviceSpec.from_string(device)
        return spec.task or 0, spec.device_type, spec.device_index

    index = {where(d): i for i, d in enumerate(devices)}
    held = [0] * len(devices)
    for variable in variables:
        value = variable.read_value()
        parts = dtensor.unpack(value) if dtensor.is_dtensor(value) else [value]
        for part in parts:
            if where(part.device) not in index:
                raise ValueError(f"Variable {variable.name!r} has a part on {part.device}, outside the plan's mesh "
                                 f"({', '.join(devices)}). Received: a model with weights off the mesh")
            held[index[where(part.device)]] += part.shape.num_elements() * part.dtype.size
    return held


def _variables(model: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """A model's weights, its optimizer's slots and its optimizer's counters, as tf.Variables."""
    from tensorfleet.compat.keras import is_keras3_model, tf_variable
    from tensorfleet.compat.tf_keras import optimizer_variables

    weights = [tf_variable(v) for v in model.weights]
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        slots: list[Any] = []
    else:
        slots = [tf_variable(v) for v in (optimizer.variables if is_keras3_model(model) else
                                          optimizer_variables(optimizer))]
    return weights, [v for v in slots if v.shape.rank], [v for v in slots if not v.shape.rank]


def _by_layout(mesh: Any, models: list[Any]) -> dict[str, float] | None:
    """The planner's per-weight model states (:mod:`.splits`) as the mesh decided each weight's layout
    (``None`` when a model has weights the mesh did not lay out)."""
    from tensorfleet.model_parallel.mesh.zero import weight_splits
    from tensorfleet.planner.splits import model_state_bytes

    try:
        weights = [w for model in models for w in weight_splits(model, mesh.keras_layout)]
    except ValueError:
        return None
    inputs = mesh.plan["inputs"]
    return model_state_bytes(weights, inputs["optimizer"], inputs["precision"], zero=mesh.zero)


def measure(mesh: Any) -> RunReport:
    """The :class:`RunReport` of a :class:`~tensorfleet.planner.runs.PlannedMesh` after its models ran."""
    devices = mesh.devices
    held: dict[str, list[int]] = {kind: [0] * len(devices) for kind in KINDS}
    seen: set[int] = set()
    for model in mesh.models:
        for kind, variables in zip(KINDS, _variables(model)):
            fresh = [v for v in variables if id(v) not in seen]
            seen.update(id(v) for v in fresh)
            held[kind] = [a + b for a, b in zip(held[kind], _per_device(fresh, devices))]
    row, plan = mesh.row, mesh.plan
    planned = {**{k: row["memory"][k] for k in ("parameters", "gradients", "optimizer_state", "activations")},
               "total": row["memory_per_device_bytes"], "step_seconds": row["step_seconds"],
               "comm_seconds": row["comm_seconds"], "compute_seconds": row["compute_seconds"],
               "batch_size": plan["inputs"]["batch_size"], "model": plan["model"],
               "model_parameters": plan["parameters"], "optimizer": plan["inputs"]["optimizer"],
               "precision": plan["inputs"]["precision"]}
    times = mesh.step_seconds
    return RunReport(strategy=row["strategy"], layout=dict(row["layout"]), mesh_shape=mesh.layout.mesh_shape,
                     rules=mesh.layout.layout, zero=mesh.zero, devices=list(devices), planned=planned, measured=held,
                     by_layout=_by_layout(mesh, mesh.models), step_seconds=statistics.median(times) if times else None,
                     steps=len(times), batch_sizes=list(mesh.batch_sizes),
                     run_parameters=sum(int(m.count_params()) for m in mesh.models))


def merge(parts: list[RunReport]) -> RunReport:
    """One report from those of the processes a mesh spans: each measured the devices it holds (the others
    zero), so the bytes add up device by device; the step is the slowest process's median."""
    first = parts[0]
    if len(parts) == 1:
        return first
    measured = {kind: [sum(p.measured[kind][i] for p in parts) for i in range(len(first.devices))] for kind in KINDS}
    timed = [p.step_seconds for p in parts if p.step_seconds is not None]
    return RunReport(**{**first.as_dict(), "measured": measured, "step_seconds": max(timed) if timed else None,
                        "steps": min(p.steps for p in parts)})
