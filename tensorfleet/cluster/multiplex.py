"""Multiplexing: migratable jobs share one set of devices by time slices at step boundaries.

After Gandiva (Xiao et al., OSDI 2018: time-slicing and migration of deep-learning jobs). Every
job's processes start at once and stay up; each job waits at every step boundary until this
scheduler allows its next step (a gate file per job, read by
:mod:`~tensorfleet.cluster.resumable`). The scheduler goes round the jobs that have not ended:
each gets ``share * quantum`` steps (fractions carried to the next round), runs them while the
others wait, and hands over. A job that ends leaves the round, so its slices go to the others in
proportion to their shares. Because no process restarts between slices, a slice costs only its
steps; the jobs' start-ups overlap with the others' slices.

Example:
    >>> from tensorfleet.cluster.migration import Placement, RunOptions
    >>> jobs = [SharedJob("a.py", "ckpt-a", Placement("mirrored"), RunOptions(epochs=2), share=0.75),
    ...         SharedJob("b.py", "ckpt-b", Placement("mirrored"), RunOptions(epochs=2), share=0.25)]
    >>> result = share(jobs, quantum=8)  # doctest: +SKIP
    >>> result.shares(), result.makespan  # doctest: +SKIP
"""

from __future__ import annotations

import contextvars
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from tensorfleet.cluster.contract import STEP_DONE, write_gate
from tensorfleet.cluster.jobstate import LATEST
from tensorfleet.cluster.migration import MigrationError, Placement, RunOptions, check_migration, job_model, migrate
from tensorfleet.cluster.result import LaunchResult
from tensorfleet.validation import positive_int, renamed, renamed_fields

__all__ = ["ShareResult", "SharedJob", "share"]

@renamed_fields(directory="out_dir")
@dataclass(frozen=True)
class SharedJob:
    """One job of a shared set: what :func:`~tensorfleet.cluster.migration.migrate` takes, and its share."""

    job: str | os.PathLike[str]
    out_dir: str | os.PathLike[str]
    to: Placement
    run: RunOptions = RunOptions()
    share: float = 0.5
    #: The job file's arguments (see :func:`~tensorfleet.cluster.migration.migrate`).
    args: Sequence[str] = ()


@dataclass
class ShareResult:
    """What a shared run did: each job's launch, the wall time of each of its steps, and the makespan
    (from starting the jobs until the last one's launch returned)."""

    results: list[LaunchResult]
    steps: list[list[float]] = field(default_factory=list)
    requested: list[float] = field(default_factory=list)
    start: float = 0.0
    makespan: float = 0.0

    def shares(self) -> list[float]:
        """Each job's fraction of the steps done while every job was still running."""
        contended = min(times[-1] for times in self.steps if times)
        counts = [sum(t <= contended for t in times) for times in self.steps]
        return [c / sum(counts) for c in counts]

    def plot(self, path: str | os.PathLike[str], *, names: Sequence[str] | None = None) -> Path:
        """A PNG timeline: one row per job, one bar per step (from the step before it to its end)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from tensorfleet.io import save_figure

        names = list(names or [f"job {i} (share {s:.2f})" for i, s in enumerate(self.requested)])
        colours = plt.get_cmap("tab10")
        fig, ax = plt.subplots(figsize=(9, 1.2 + 0.5 * len(self.steps)))
        ends = sorted((t, i) for i, times in enumerate(self.steps) for t in times)
        previous = self.start
        for n, (end, i) in enumerate(ends):  # the first bar holds every job's start-up: grey
            ax.barh(i, end - previous, left=previous - self.start, height=0.6,
                    color="lightgrey" if n == 0 else colours(i % 10))
            previous = end
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the jobs started (a bar: one step, from the step before it on any job; "
                      "grey: start-up)")
        ax.set_title(f"{len(self.steps)} jobs time-sliced at step boundaries, makespan {self.makespan:.1f} s")
        fig.tight_layout()
        return save_figure(fig, path)


def _check_shares(jobs: Sequence[SharedJob]) -> None:
    if len(jobs) < 2:
        raise MigrationError(f"Sharing devices needs at least two jobs. Received: {len(jobs)} job(s)")
    shares = [j.share for j in jobs]
    if any(not isinstance(s, (int, float)) or not 0 < s < 1 for s in shares) or not math.isclose(sum(shares), 1.0):
        raise MigrationError(f"The jobs' shares must each be between 0 and 1 and sum to 1. Received: shares={shares} "
                             f"(sum {sum(s for s in shares if isinstance(s, (int, float))):g})")


def _check_jobs(jobs: Sequence[SharedJob], quantum: int) -> None:
    """Every job is checked before any starts."""
    _check_shares(jobs)
    positive_int("quantum", quantum)
    for job in jobs:
        check_migration(job.out_dir, to=job.to, run=job.run, model=job_model(Path(job.job), job.args),
                        resume=(Path(job.out_dir) / LATEST).exists())


def _closed_gates(scratch: Path, count: int) -> list[Path]:
    """One gate file a job in ``scratch``, each at 0 steps allowed."""
    gates = [scratch / f"gate-{i}" for i in range(count)]
    for gate in gates:
        write_gate(gate, 0)
    return gates


@renamed(sink="log")
def share(jobs: Sequence[SharedJob], *, quantum: int = 8, log: Callable[[str], None] | None = None,
          timeout: float | None = None) -> ShareResult:
    """Runs ``jobs`` at once on this machine, time-sliced at step boundaries by their shares.

    Args:
        jobs: the jobs, each with its placement, run options and share (the shares sum to 1).
        quantum: steps in one round of the scheduler, split between the jobs by their shares.
        log: receives every output line, prefixed with the job's index.
        timeout: seconds each job may run.

    Raises:
        MigrationError: shares that do not sum to 1, fewer than two jobs, or a job that
            :func:`~tensorfleet.cluster.migration.check_migration` refuses; nothing has started.
    """
    _check_jobs(jobs, quantum)
    scratch = Path(tempfile.mkdtemp(prefix="tensorfleet-share-"))
    gates = _closed_gates(scratch, len(jobs))
    done_steps: list[list[float]] = [[] for _ in jobs]
    results: list[Any] = [None] * len(jobs)

    def watch(i: int) -> Callable[[str], None]:
        def seen(line: str) -> None:
            found = STEP_DONE.read(line)
            if found and line.startswith(("[worker:0]", "[chief:0]")):
                done_steps[i].append(found["at"])
            if log is not None:
                log(f"[job {i}] {line}")
        return seen

    def run(i: int) -> None:
        job = jobs[i]
        results[i] = migrate(job.job, job.out_dir, to=job.to, run=replace(job.run, gate=str(gates[i])),
                             log=watch(i), check=False, timeout=timeout, args=job.args)

    # Each job's thread runs in a copy of the caller's context (the hooks of tensorfleet.testing reach its launch).
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(run, i), name=f"tensorfleet-share-{i}",
                                daemon=True) for i in range(len(jobs))]
    start = time.time()
    for thread in threads:
        thread.start()
    try:
        _schedule(jobs, gates, done_steps, threads, quantum)
    finally:
        for thread in threads:
            thread.join()
        for gate in gates:
            gate.unlink(missing_ok=True)
        scratch.rmdir()
    return ShareResult(results=results, steps=done_steps, requested=[j.share for j in jobs], start=start,
                       makespan=time.time() - start)


def _schedule(jobs: Sequence[SharedJob], gates: list[Path], done_steps: list[list[float]],
              threads: list[threading.Thread], quantum: int) -> None:
    """Rounds of slices until every job has ended; a slice ends when its steps are done or its job ends."""
    allowed = [0] * len(jobs)
    credit = [0.0] * len(jobs)
    while any(t.is_alive() for t in threads):
        active = [i for i, t in enumerate(threads) if t.is_alive()]
        total = sum(jobs[i].share for i in active)
        for i in active:
            credit[i] += quantum * jobs[i].share / total
            grant = int(credit[i])
            if grant == 0:
                continue
            credit[i] -= grant
            allowed[i] = len(done_steps[i]) + grant
            write_gate(gates[i], allowed[i])
            while len(done_steps[i]) < allowed[i] and threads[i].is_alive():
                time.sleep(0.005)
