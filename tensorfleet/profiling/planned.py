"""Measured communication against the planner's prediction for the same all-reduce.

The planner (:mod:`tensorfleet.planner.cost_model`) predicts an all-reduce of ``nbytes`` on ``n``
workers from a link's latency and bandwidth. A recorded synchronous job measures it: every task's
collective time per step. A task that arrives late at the collective finds the others there and
waits least, so the least communication time among the tasks of a step is the closest to the
transfer itself (the rest is waiting for the slowest task); the median over steps is compared.

Example:
    >>> from tensorfleet.planner.cost_model import Link
    >>> check = compare(JobProfile(None, [], [], None, []), gradient_bytes=4e6, workers=2,
    ...                 link=Link(alpha=1e-3, beta=1 / 0.33e9), measured_ms=15.0, step_ms=60.0)
    >>> round(check.predicted_ms, 2), round(check.error, 3)
    (14.12, 0.062)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensorfleet.profiling.breakdown import JobProfile, TaskRole
from tensorfleet.validation import number, positive_int

if TYPE_CHECKING:
    from tensorfleet.planner.cost_model import Link

__all__ = ["CommunicationCheck", "compare", "measured_communication_ms"]


@dataclass(frozen=True)
class CommunicationCheck:
    """Communication per step, measured and predicted, in milliseconds."""

    algorithm: str
    workers: int
    gradient_bytes: float
    measured_ms: float
    predicted_ms: float
    step_ms: float

    @property
    def error(self) -> float:
        """(measured - predicted) / predicted."""
        return (self.measured_ms - self.predicted_ms) / self.predicted_ms if self.predicted_ms else float("nan")

    @property
    def measured_share(self) -> float:
        return self.measured_ms / self.step_ms if self.step_ms else 0.0


def measured_communication_ms(profile: JobProfile) -> tuple[float, float]:
    """(median over steps of the least communication among tasks, median step) of a recorded job.

    In a parameter-server job the workers' steps are their own, not the same steps on every task:
    there the median is taken over every worker step.
    """
    hosts = {s.task: s.device for s in profile.steps if s.device.startswith("/host:")}
    roles = {t.task: t.role for t in profile.tasks}
    ps_job = TaskRole.WORKER in roles.values()
    by_step: dict[int, list[float]] = {}
    steps: list[float] = []
    for row in profile.steps:
        if (hosts.get(row.task) == row.device
                and roles.get(row.task, TaskRole.TRAINER) in (TaskRole.TRAINER, TaskRole.WORKER)):
            by_step.setdefault(len(steps) if ps_job else row.step, []).append(row.communication_ms)
            steps.append(row.step_ms)
    if not by_step:
        raise ValueError("The profile holds no step to measure communication in.")
    return statistics.median(min(v) for v in by_step.values()), statistics.median(steps)


def compare(profile: JobProfile, *, gradient_bytes: float, workers: int, link: Link, algorithm: str = "ring",
            measured_ms: float | None = None, step_ms: float | None = None) -> CommunicationCheck:
    """The planner's all-reduce time for ``gradient_bytes`` on ``workers`` over ``link`` beside the
    communication measured in ``profile`` (or the given ``measured_ms`` and ``step_ms``)."""
    from tensorfleet.planner.cost_model import predict

    number("gradient_bytes", gradient_bytes, minimum=0)
    positive_int("workers", workers)
    if measured_ms is None or step_ms is None:
        measured_ms, step_ms = measured_communication_ms(profile)
    predicted = predict(algorithm, workers, gradient_bytes, link) * 1e3
    return CommunicationCheck(algorithm, workers, float(gradient_bytes), float(measured_ms), predicted, float(step_ms))
