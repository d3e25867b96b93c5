"""Pipeline schedules: which forward and backward pass each device runs, in which order.

- ``gpipe``: all forward passes, then all backward passes (Huang et al., "GPipe: Efficient
  Training of Giant Neural Networks using Pipeline Parallelism", 2019).
- ``1f1b``: after ``p - s - 1`` warm-up forwards, stage ``s`` alternates one forward and one
  backward (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training",
  2019; the flushing variant of "Memory-Efficient Pipeline-Parallel DNN Training", 2021).
- ``interleaved``: each device holds ``v`` non-consecutive model chunks (virtual stages)
  (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", 2021). Needs ``m`` to be a multiple of ``p``.

The orders are pure functions of ``(p, m, v)``, registered by name in :data:`SCHEDULES`.

Example:
    >>> [f"{op.phase.value[0]}{op.micro_batch}" for op in schedule_orders("gpipe", 2, 2)[1]]
    ['f0', 'f1', 'b0', 'b1']
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable

from tensorfleet.registry import Registry
from tensorfleet.validation import positive_int

__all__ = ["Pass", "SCHEDULES", "Schedule", "ScheduledOp", "dependency", "schedule_orders"]


class Schedule(str, enum.Enum):
    """The pipeline schedules."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class Pass(str, enum.Enum):
    """Which pass of one micro-batch through one stage: forward or backward."""

    FORWARD = "forward"
    BACKWARD = "backward"


@dataclasses.dataclass(frozen=True)
class ScheduledOp:
    """One unit of work in a device's order: the ``phase`` pass of ``micro_batch`` through ``stage``."""

    phase: Pass
    stage: int
    micro_batch: int


def _gpipe(p: int, m: int, v: int) -> list[list[ScheduledOp]]:
    return [[ScheduledOp(Pass.FORWARD, d, j) for j in range(m)] + [ScheduledOp(Pass.BACKWARD, d, j) for j in range(m)]
            for d in range(p)]


def _one_f_one_b(p: int, m: int, v: int) -> list[list[ScheduledOp]]:
    orders = []
    for d in range(p):
        warmup = min(p - d - 1, m)
        ops = [ScheduledOp(Pass.FORWARD, d, j) for j in range(warmup)]
        for j in range(warmup, m):
            ops += [ScheduledOp(Pass.FORWARD, d, j), ScheduledOp(Pass.BACKWARD, d, j - warmup)]
        ops += [ScheduledOp(Pass.BACKWARD, d, j) for j in range(m - warmup, m)]
        orders.append(ops)
    return orders


def _interleaved(p: int, m: int, v: int) -> list[list[ScheduledOp]]:
    # Megatron-LM's forward_backward_pipelining_with_interleaving: micro-batches go round the
    # device's chunks in groups of p; chunk c of device d is stage c * p + d.
    if m % p != 0:
        raise ValueError(
            "The interleaved schedule needs micro_batches to be a multiple of the number of pipeline "
            f"devices. Received: micro_batches={m}, devices={p}"
        )
    total = m * v

    def forward(d: int, k: int) -> ScheduledOp:
        return ScheduledOp(Pass.FORWARD, ((k // p) % v) * p + d, (k // (p * v)) * p + k % p)

    def backward(d: int, k: int) -> ScheduledOp:
        return ScheduledOp(Pass.BACKWARD, (v - 1 - (k // p) % v) * p + d, (k // (p * v)) * p + k % p)

    orders = []
    for d in range(p):
        warmup = total if m == p else min((p - d - 1) * 2 + (v - 1) * p, total)
        ops = [forward(d, k) for k in range(warmup)]
        for i in range(total - warmup):
            ops += [forward(d, warmup + i), backward(d, i)]
        ops += [backward(d, i) for i in range(total - warmup, total)]
        orders.append(ops)
    return orders


SCHEDULES: Registry[Callable[[int, int, int], list[list[ScheduledOp]]]] = Registry("pipeline schedule")
SCHEDULES.register("gpipe", _gpipe, description="All forward passes, then all backward passes (GPipe).")
SCHEDULES.register("1f1b", _one_f_one_b, aliases=("one_f_one_b", "pipedream_flush"),
                   description="Warm-up forwards, then one forward one backward (PipeDream-Flush).")
SCHEDULES.register("interleaved", _interleaved, aliases=("interleaved_1f1b",),
                   description="1F1B over v virtual stages per device (Megatron-LM interleaved).")


def schedule_orders(schedule: str | Schedule, num_devices: int, micro_batches: int,
                    virtual_stages: int = 1) -> list[list[ScheduledOp]]:
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
    p = positive_int("num_devices", num_devices)
    m = positive_int("micro_batches", micro_batches)
    v = positive_int("virtual_stages", virtual_stages)
    if v != 1 and name != Schedule.INTERLEAVED.value:
        raise ValueError(f"virtual_stages applies to the 'interleaved' schedule only. "
                         f"Received: schedule={name!r}, virtual_stages={v}")
    return SCHEDULES.get(name)(p, m, v)


def dependency(op: ScheduledOp, num_stages: int) -> ScheduledOp | None:
    """The op whose result ``op`` needs: the previous stage's forward, the next stage's backward
    (the last stage's backward needs its own forward); None for the first stage's forward."""
    if op.phase is Pass.FORWARD:
        return ScheduledOp(Pass.FORWARD, op.stage - 1, op.micro_batch) if op.stage > 0 else None
    if op.stage == num_stages - 1:
        return ScheduledOp(Pass.FORWARD, op.stage, op.micro_batch)
    return ScheduledOp(Pass.BACKWARD, op.stage + 1, op.micro_batch)
