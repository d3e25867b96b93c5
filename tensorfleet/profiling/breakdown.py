"""Where each step's time goes, per step, device and task, and the job's verdict.

The temporal breakdown follows Holistic Trace Analysis (Meta's HTA for PyTorch traces): a step's
wall time is split into disjoint parts that add up to it,

    step = compute + exposed communication + input + idle

where *compute* is the union of op executions, *exposed communication* the part of collective,
send/recv and RPC time not hidden under compute, *input* the part of the wait for the next batch
hidden under neither, and *idle* the rest (Python, dispatch, waiting on nothing recorded). The
*overlap* is the share of communication that ran while ops computed.

Across tasks, a synchronous job runs at the pace of its slowest task: the others wait inside the
collective. A task's own work per step is therefore ``step - exposed communication``; when that
differs much between tasks, the job is straggler-bound and the task with the most is named.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Iterable, Sequence

from tensorfleet.profiling.intervals import clip, intersect, length, subtract, union
from tensorfleet.profiling.xspace import DeviceSpans, Step, TaskTrace, task_traces

__all__ = ["Bottleneck", "StepBreakdown", "TaskSummary", "Verdict", "JobProfile", "analyze", "break_down_step",
           "judge", "summarize", "STRAGGLER_SPREAD", "MANY_COLLECTIVES"]

# A task whose own work per step exceeds the least-loaded task's by this share of the step makes the
# job straggler-bound (the others then wait that long in every collective).
STRAGGLER_SPREAD = 0.25
# More collectives than this per step, each short, are latency-bound: packing them helps more than
# a larger batch.
MANY_COLLECTIVES = 16


class Bottleneck(str, Enum):
    INPUT = "input-bound"
    COMMUNICATION = "communication-bound"
    COMPUTE = "compute-bound"
    STRAGGLER = "straggler-bound"


@dataclass(frozen=True)
class StepBreakdown:
    """One step of one device of one task, in milliseconds; the four parts add up to ``step_ms``."""

    task: str
    device: str
    step: int
    step_ms: float
    compute_ms: float
    exposed_communication_ms: float
    input_ms: float
    idle_ms: float
    communication_ms: float  # all of it, hidden or not
    overlap_ms: float  # communication that ran under compute
    collectives: int

    @property
    def own_work_ms(self) -> float:
        """The step less the time spent waiting for other tasks."""
        return self.step_ms - self.exposed_communication_ms


def break_down_step(task: str, device: str, step: Step, spans: DeviceSpans) -> StepBreakdown:
    """Splits one step's window of ``spans`` into compute, exposed communication, input and idle.

    Example:
        >>> spans = DeviceSpans(compute=[(0, 4)], communication=[(3, 6)], input=[(6, 8), (1, 2)])
        >>> b = break_down_step("worker-0", "/host:CPU", Step(7, 0, 10), spans)
        >>> b.compute_ms, b.exposed_communication_ms, b.input_ms, b.idle_ms, b.overlap_ms
        (4.0, 2.0, 2.0, 2.0, 1.0)
    """
    start, end = step.start_ms, step.end_ms
    compute = clip(spans.compute, start, end)
    communication = clip(spans.communication, start, end)
    waiting = clip(spans.input, start, end)
    busy = union([*compute, *communication])
    exposed = subtract(communication, compute)
    input_only = subtract(waiting, busy)
    covered = length(compute) + length(exposed) + length(input_only)
    collectives = sum(1 for s, e in spans.communication if s < end and e > start)
    return StepBreakdown(
        task=task, device=device, step=step.number, step_ms=end - start, compute_ms=length(compute),
        exposed_communication_ms=length(exposed), input_ms=length(input_only),
        idle_ms=max(0.0, (end - start) - covered), communication_ms=length(communication),
        overlap_ms=length(intersect(communication, compute)), collectives=collectives)


@dataclass(frozen=True)
class TaskSummary:
    """A task's mean step (host device), part by part, in milliseconds.

    Means, not medians: the parts of the mean step add up to it, and a pipeline that stalls every
    other step (a batch split between two replicas) keeps its stalls.
    """

    task: str
    steps: int
    step_ms: float
    compute_ms: float
    exposed_communication_ms: float
    input_ms: float
    idle_ms: float
    communication_ms: float
    overlap: float  # share of communication hidden under compute, 0..1
    collectives: float
    own_work_ms: float


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return float(statistics.fmean(values)) if values else 0.0


def summarize(task: str, steps: Sequence[StepBreakdown]) -> TaskSummary:
    comm = _mean(b.communication_ms for b in steps)
    return TaskSummary(
        task=task, steps=len(steps), step_ms=_mean(b.step_ms for b in steps),
        compute_ms=_mean(b.compute_ms for b in steps),
        exposed_communication_ms=_mean(b.exposed_communication_ms for b in steps),
        input_ms=_mean(b.input_ms for b in steps), idle_ms=_mean(b.idle_ms for b in steps),
        communication_ms=comm, overlap=_mean(b.overlap_ms for b in steps) / comm if comm else 0.0,
        collectives=_mean(b.collectives for b in steps), own_work_ms=_mean(b.own_work_ms for b in steps))


@dataclass(frozen=True)
class Verdict:
    """What bounds the job, the numbers behind it, and the one change most likely to help."""

    bottleneck: Bottleneck
    reason: str
    advice: str
    straggler: str | None = None


_STRAGGLER_FIX = {
    "input": "its input pipeline waits for data (prefetch, a parallel map, a faster disk)",
    "compute": "its ops run slower (a slower or shared device; give it less work or replace it)",
    "idle": "its host is slow between ops (a busy CPU, Python work in the step)",
}


def _straggler(tasks: Sequence[TaskSummary], step_ms: float) -> Verdict | None:
    if len(tasks) < 2 or step_ms <= 0:
        return None
    ranked = sorted(tasks, key=lambda t: t.own_work_ms)
    slow, fastest = ranked[-1], ranked[0]
    spread = (slow.own_work_ms - fastest.own_work_ms) / step_ms
    if spread < STRAGGLER_SPREAD:
        return None
    parts = {"input": slow.input_ms, "compute": slow.compute_ms, "idle": slow.idle_ms}
    cause = max(parts, key=parts.get)
    return Verdict(
        Bottleneck.STRAGGLER,
        f"{slow.task}'s own work is {slow.own_work_ms:.1f} ms per step against {fastest.own_work_ms:.1f} ms on "
        f"{fastest.task} ({spread:.0%} of the {step_ms:.1f} ms step); most of it {cause} ({parts[cause]:.1f} ms)",
        f"the slow worker is {slow.task}: {_STRAGGLER_FIX[cause]}; the others wait for it every step",
        straggler=slow.task)


def judge(tasks: Sequence[TaskSummary]) -> Verdict:
    """The job's verdict from its tasks' mean steps (see the module docstring)."""
    if not tasks:
        raise ValueError("No steps to judge: the trace holds no recorded training step.")
    step = _mean(t.step_ms for t in tasks)
    straggler = _straggler(tasks, step)
    if straggler is not None:
        return straggler
    mean = {name: statistics.fmean(getattr(t, f"{name}_ms") for t in tasks)
            for name in ("input", "exposed_communication", "compute", "idle")}
    share = {name: value / step if step else 0.0 for name, value in mean.items()}
    numbers = (f"per step of {step:.1f} ms: input {mean['input']:.1f} ms ({share['input']:.0%}), exposed "
               f"communication {mean['exposed_communication']:.1f} ms ({share['exposed_communication']:.0%}), "
               f"compute {mean['compute']:.1f} ms ({share['compute']:.0%}), idle {mean['idle']:.1f} ms "
               f"({share['idle']:.0%})")
    top = max(mean, key=mean.get)
    if top == "input":
        return Verdict(Bottleneck.INPUT, numbers,
                       f"prefetch: each step waits {mean['input']:.1f} ms for its batch; add "
                       ".prefetch(tf.data.AUTOTUNE), map(..., num_parallel_calls=tf.data.AUTOTUNE) or cache()")
    if top == "exposed_communication":
        collectives = statistics.fmean(t.collectives for t in tasks)
        if collectives > MANY_COLLECTIVES:
            advice = (f"another cross-device op: {collectives:.0f} collectives per step are latency-bound; pack "
                      "them (CommunicationOptions(bytes_per_pack=...)) or use NCCL on GPUs")
        else:
            advice = (f"larger per-replica batch: communication ({mean['exposed_communication']:.1f} ms) moves "
                      "the same gradients whatever the batch, so a larger batch divides it per example")
        return Verdict(Bottleneck.COMMUNICATION, numbers, advice)
    if top == "idle":
        return Verdict(Bottleneck.COMPUTE, numbers,
                       f"larger per-replica batch: {mean['idle']:.1f} ms per step is host time between ops "
                       "(dispatch, scheduling, Python) that a larger batch spreads over more examples")
    return Verdict(Bottleneck.COMPUTE, numbers,
                   "more replicas (see tensorfleet plan) or mixed precision: the ops themselves fill the step")


@dataclass
class JobProfile:
    """A whole capture analysed: every step of every device of every task, per-task means, verdict."""

    directory: Path | None
    steps: list[StepBreakdown]
    tasks: list[TaskSummary]
    verdict: Verdict
    traces: list[TaskTrace]

    def to_dict(self) -> dict:
        return {
            "directory": str(self.directory) if self.directory else None,
            "verdict": {**asdict(self.verdict), "bottleneck": self.verdict.bottleneck.value},
            "tasks": [asdict(t) for t in self.tasks],
            "steps": [{**asdict(s), "own_work_ms": s.own_work_ms} for s in self.steps],
            "files": {t.task: str(t.path) for t in self.traces},
        }


def _host(trace: TaskTrace) -> str:
    hosts = [name for name in trace.devices if name.startswith("/host:")]
    return hosts[0] if hosts else next(iter(trace.devices), "/host:CPU")


def analyze(source: str | Path | Sequence[TaskTrace], *, skip_first: bool = True) -> JobProfile:
    """Reads every task's capture under ``source`` (or takes read traces) and breaks its steps down.

    Args:
        source: a directory as :func:`tensorfleet.profiling.recorder` writes it (one sub-directory per
            task), a single capture directory, or traces read with :func:`task_traces`.
        skip_first: leave out each task's first recorded step when it has more than two; it carries the
            profiler's start-up cost.

    Example:
        >>> profile = analyze("profile/")           # doctest: +SKIP
        >>> profile.verdict.bottleneck, profile.verdict.advice   # doctest: +SKIP
        (<Bottleneck.INPUT: 'input-bound'>, 'prefetch: each step waits 48.7 ms for its batch; ...')
    """
    directory = Path(source) if isinstance(source, (str, Path)) else None
    traces = task_traces(directory) if directory is not None else list(source)
    rows: list[StepBreakdown] = []
    summaries = []
    for trace in traces:
        steps = trace.steps[1:] if skip_first and len(trace.steps) > 2 else trace.steps
        if not steps:
            raise ValueError(f"{trace.task}: no training step in {str(trace.path)!r}. Record whole steps: "
                             "start the capture before a step begins and stop it after one ends.")
        host = _host(trace)
        for device, spans in trace.devices.items():
            rows += [break_down_step(trace.task, device, step, spans) for step in steps]
        summaries.append(summarize(trace.task, [r for r in rows if r.task == trace.task and r.device == host]))
    return JobProfile(directory, rows, summaries, judge(summaries), traces)
