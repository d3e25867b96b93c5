"""Recording the worker and ps tasks of a parameter-server job from its coordinator.

In a parameter-server job the chief only schedules steps; the workers run them and the ps tasks
serve the variables, each in its own process. Every task's ``tf.distribute.Server`` also serves
TensorFlow's profiler service, so the coordinator records them remotely with
``tf.profiler.experimental.client.trace``: one call per task (calls to several hosts in one
request run one after another in TensorFlow 2.14), each in its own thread, all asked to start at
the same instant (``delay_ms``), each writing into its own ``<logdir>/<role>-<index>/`` as the
other captures do. The directory must be one every task can write to (a shared file system on a
real cluster; any local directory on one machine).

A remote trace runs for a fixed time, so the coordinator makes the chosen steps fit inside it:
it waits for the steps already scheduled (``ClusterCoordinator.join``) before the first chosen
step, so no earlier step runs in the traces, and again after the last, then waits for the traces
to end before it schedules more, so no later step does. The traces hold exactly the chosen steps;
the job pauses once, for the rest of the trace time (about the recording's length plus a second).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RemoteTask", "RemoteCapture", "remote_tasks", "trace_duration_ms", "START_DELAY_MS"]

log = logging.getLogger(__name__)

# Every task starts recording this long after the requests go out: enough for the RPCs to arrive.
START_DELAY_MS = 300
_MIN_TRACE_MS = 1000
_MAX_TRACE_MS = 300_000
_DEFAULT_STEP_S = 1.0  # the pace assumed when no step ran before the chosen ones


@dataclass(frozen=True)
class RemoteTask:
    """A task recorded remotely: its folder name (``worker-1``) and its server's address."""

    name: str
    address: str


def remote_tasks(strategy: Any) -> list[RemoteTask]:
    """The worker and ps tasks of a parameter-server ``strategy``'s cluster; ``[]`` for other strategies.

    Example:
        >>> remote_tasks(None)
        []
    """
    from tensorfleet.compat.profiler import cluster_resolver, uses_coordinator

    if not uses_coordinator(strategy):
        return []
    resolver = cluster_resolver(strategy)
    if resolver is None:
        return []
    spec = resolver.cluster_spec().as_dict()
    tasks = []
    for role in ("worker", "ps"):
        addresses = spec.get(role, [])
        if isinstance(addresses, dict):  # a sparse cluster spec: {index: address}
            addresses = [addresses[i] for i in sorted(addresses)]
        tasks += [RemoteTask(f"{role}-{index}", address) for index, address in enumerate(addresses)]
    return tasks


def trace_duration_ms(steps: int, seconds_per_step: float | None) -> int:
    """How long the remote traces run: twice the chosen steps' expected time and a second, bounded.

    Example:
        >>> trace_duration_ms(10, 0.05), trace_duration_ms(10, None), trace_duration_ms(1, 0.001)
        (2000, 21000, 1002)
    """
    pace = _DEFAULT_STEP_S if seconds_per_step is None else seconds_per_step
    wanted = 2 * steps * pace * 1000 + 1000
    return int(min(_MAX_TRACE_MS, max(_MIN_TRACE_MS, round(wanted))))


@dataclass
class RemoteCapture:
    """Remote traces of ``tasks`` into ``out_dir/<task>``, started together and awaited together."""

    out_dir: Path
    tasks: list[RemoteTask]
    duration_ms: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    _threads: list[threading.Thread] = field(default_factory=list)
    _started: float = 0.0

    def start(self, duration_ms: int) -> None:
        """Asks every task to record for ``duration_ms`` and returns once all of them record."""
        import tensorflow as tf

        self.duration_ms = int(duration_ms)
        options = tf.profiler.experimental.ProfilerOptions(delay_ms=START_DELAY_MS)
        for task in self.tasks:
            directory = self.out_dir / task.name
            directory.mkdir(parents=True, exist_ok=True)
            thread = threading.Thread(target=self._trace, args=(task, directory, options),
                                      name=f"profile-{task.name}", daemon=True)
            self._threads.append(thread)
        self._started = time.monotonic()
        for thread in self._threads:
            thread.start()
        time.sleep(START_DELAY_MS / 1000 + 0.05)

    def _trace(self, task: RemoteTask, directory: Path, options: Any) -> None:
        import tensorflow as tf

        try:
            # One attempt: a ps with nothing to record would otherwise be asked twice more.
            tf.profiler.experimental.client.trace(f"grpc://{task.address}", str(directory), self.duration_ms,
                                                  num_tracing_attempts=1, options=options)
        except Exception as exc:  # the profiler raises its own error types; keep the job running
            self.errors[task.name] = f"{type(exc).__name__}: {exc}"

    @property
    def started(self) -> bool:
        return bool(self._threads)

    @property
    def elapsed_ms(self) -> float:
        """Milliseconds since the traces began."""
        return (time.monotonic() - self._started) * 1000 - START_DELAY_MS

    def finish(self) -> None:
        """Waits for every trace to end and be written; logs the tasks that could not be recorded."""
        late = self.elapsed_ms > self.duration_ms
        for thread in self._threads:
            thread.join(timeout=self.duration_ms / 1000 + 120)
        if late:
            log.warning("The chosen steps took longer than the %d ms the worker and ps tasks recorded; their traces "
                        "miss the last steps. Record fewer steps.", self.duration_ms)
        for name, error in sorted(self.errors.items()):
            log.warning("Could not record %s: %s", name, error)
