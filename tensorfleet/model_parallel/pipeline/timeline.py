"""Pipeline timelines: ops laid out in time, their bubble, their activation peak, their chart.

A :class:`TimelineEvent` is one forward or backward pass with its start and end: simulated with
fixed costs by :func:`simulate`, or recorded by a real :class:`~tensorfleet.model_parallel.pipeline.Pipeline`
step. With equal per-stage cost the bubble fraction (idle share of device time) is
``(p - 1) / (m + p - 1)`` for GPipe and 1F1B and ``(p - 1) / (v m + p - 1)`` interleaved
(:func:`theoretical_bubble`).

Example:
    >>> from tensorfleet.model_parallel.pipeline.schedules import schedule_orders
    >>> gpipe, one_f_one_b = (simulate(schedule_orders(name, 4, 8)) for name in ("gpipe", "1f1b"))
    >>> peak_activations(gpipe), peak_activations(one_f_one_b)  # m for GPipe, at most p for 1F1B
    (8, 4)
    >>> round(bubble_fraction(one_f_one_b), 4), round(theoretical_bubble(4, 8), 4)
    (0.2727, 0.2727)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from tensorfleet.model_parallel.pipeline.schedules import Pass, ScheduledOp, dependency

__all__ = ["TimelineEvent", "bubble_fraction", "peak_activations", "plot_schedule", "simulate", "theoretical_bubble"]


@dataclasses.dataclass(frozen=True)
class TimelineEvent:
    """One executed (or simulated) op with its start and end time in seconds (or cost units)."""

    device: int
    stage: int
    micro_batch: int
    phase: Pass
    start: float
    end: float
    replica: int = 0
    placed_on: str = ""
    """Where the op's result tensor was placed (real runs only), e.g. ``/job:localhost/.../device:CPU:1``."""


def simulate(orders: Sequence[Sequence[ScheduledOp]], *, forward_cost: float = 1.0,
             backward_cost: float = 2.0) -> list[TimelineEvent]:
    """Lays the orders out in time with fixed per-op costs (no communication cost).

    Each op starts when its device is free and the op it depends on (the previous stage's
    forward, the next stage's backward) has ended.

    Example:
        >>> from tensorfleet.model_parallel.pipeline.schedules import schedule_orders
        >>> events = simulate(schedule_orders("gpipe", 2, 2))
        >>> round(bubble_fraction(events), 4)
        0.3333
    """
    num_stages = 1 + max(op.stage for order in orders for op in order)
    ends: dict[ScheduledOp, float] = {}
    free = [0.0] * len(orders)
    position = [0] * len(orders)
    events: list[TimelineEvent] = []
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for d, order in enumerate(orders):
            while position[d] < len(order):
                op = order[position[d]]
                dep = dependency(op, num_stages)
                if dep is not None and dep not in ends:
                    break
                start = max(free[d], ends[dep] if dep is not None else 0.0)
                end = start + (forward_cost if op.phase is Pass.FORWARD else backward_cost)
                ends[op], free[d] = end, end
                events.append(TimelineEvent(d, op.stage, op.micro_batch, op.phase, start, end))
                position[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("The pipeline orders deadlock: "
                               f"{[order[i] for order, i in zip(orders, position) if i < len(order)]}")
    return events


def bubble_fraction(events: Sequence[TimelineEvent], num_devices: int | None = None) -> float:
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


def peak_activations(events: Sequence[TimelineEvent]) -> int:
    """Most micro-batch activations one device holds at once (forward done, backward not)."""
    peak = 0
    by_device: dict[tuple[int, int], list[TimelineEvent]] = {}
    for e in events:
        by_device.setdefault((e.replica, e.device), []).append(e)
    for device_events in by_device.values():
        live = 0
        for e in sorted(device_events, key=lambda e: (e.start, e.end)):
            live += 1 if e.phase is Pass.FORWARD else -1
            peak = max(peak, live)
    return peak

def plot_schedule(events: Sequence[TimelineEvent], path: str | os.PathLike[str], *,
                  title: str = "Pipeline schedule") -> Any:
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
    colours = {Pass.FORWARD: "#4C72B0", Pass.BACKWARD: "#DD8452"}
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
