"""The record of a launched job: every output line, the launcher's events, each process's span,
and a PNG timeline of the run.

Example:
    >>> from tensorfleet.strategies.tf_config import ClusterSpec
    >>> result = LaunchResult(returncode=0, restarts=0, cluster=ClusterSpec.local(workers=1),
    ...                       lines=[LogLine(0.5, "worker:0", 0, "hello")])
    >>> result.ok, result.output("worker:0"), result.first_time("^hel")
    (True, ['hello'], 0.5)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tensorfleet.cluster.contract import describe_exit
from tensorfleet.strategies.tf_config import ClusterSpec

__all__ = ["LaunchResult", "LogLine", "TaskSpan"]


@dataclass(frozen=True)
class LogLine:
    """One line of output: when (seconds since launch), from which task and attempt."""

    time: float
    task: str
    attempt: int
    text: str


@dataclass(frozen=True)
class TaskSpan:
    """One process of a task: its attempt, start and end (s since launch) and exit status."""

    task: str
    attempt: int
    start: float
    end: float
    status: int | None


@dataclass
class LaunchResult:
    """The record of a launched job."""

    returncode: int
    restarts: int
    cluster: ClusterSpec
    lines: list[LogLine] = field(default_factory=list)
    events: list[LogLine] = field(default_factory=list)
    duration: float = 0.0
    stopped: bool = False
    error: str | None = None
    spans: list[TaskSpan] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def output(self, task: str | None = None, attempt: int | None = None) -> list[str]:
        """Output lines (without prefixes), optionally of one task and/or attempt."""
        return [
            line.text
            for line in self.lines
            if (task is None or line.task == task) and (attempt is None or line.attempt == attempt)
        ]

    def first_time(self, pattern: str, *, task: str | None = None, after: float = 0.0) -> float | None:
        """Time (s since launch) of the first line matching ``pattern`` after ``after``."""
        regex = re.compile(pattern)
        for line in self.lines:
            if line.time >= after and (task is None or line.task == task) and regex.search(line.text):
                return line.time
        return None

    def plot(self, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
        """A PNG timeline: one row per task, one bar per process, launcher events as lines.

        Example:
            >>> result.plot("job.png")  # doctest: +SKIP
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from tensorfleet.io import save_figure

        tasks = [str(t) for t in self.cluster.tasks()]
        colours = plt.get_cmap("tab10")
        fig, ax = plt.subplots(figsize=(9, 1.0 + 0.5 * len(tasks)))
        for span in self.spans:
            row = tasks.index(span.task)
            ax.barh(row, span.end - span.start, left=span.start, height=0.6, color=colours(span.attempt % 10),
                    edgecolor="black", linewidth=0.5)
            if span.status not in (0, None):
                ax.text(span.end, row, f" {describe_exit(span.status).split(' ', 1)[1]}", va="center", fontsize=7)
        for event in self.events:
            if event.text.startswith(("injecting fault", "restarted")):
                ax.axvline(event.time, color="red" if event.text.startswith("injecting") else "green",
                           linestyle="--", linewidth=0.8)
        ax.set_yticks(range(len(tasks)), tasks)
        ax.invert_yaxis()
        ax.set_xlabel("seconds since launch (colour: attempt; red: fault injected; green: restart)")
        ax.set_title(title or f"exit status {self.returncode}, {self.restarts} restart(s), {self.duration:.1f} s")
        fig.tight_layout()
        return save_figure(fig, path)
