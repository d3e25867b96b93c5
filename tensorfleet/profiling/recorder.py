"""Recording a profiler trace for chosen steps, one directory per task.

TensorFlow's profiler (``tf.profiler.experimental.start``/``stop``) records everything that runs
while it is on. These helpers turn it on for a chosen range of training steps only, so a long job
pays nothing outside them, and mark each chosen step with the ``train`` step annotation
(as Keras' ``fit`` does: :func:`tensorfleet.compat.profiler.step_trace`) that the analysis
cuts steps by. Each task writes under ``<out_dir>/<role>-<index>/`` (from TF_CONFIG; ``local``
without one), so every worker of a job can share one ``out_dir``:

    out_dir/worker-0/plugins/profile/<run>/<host>.xplane.pb
    out_dir/worker-1/plugins/profile/<run>/<host>.xplane.pb

A step range is ``"20-30"`` (both ends included), one step ``"25"`` or ``25``, or a ``range``.
Steps count the batches of the whole ``fit`` from 0, across epochs; the trace labels them as
``fit`` does, by their number within their epoch.

Jobs started by a launcher choose the steps from the environment: :func:`callbacks` returns a
:class:`~tensorfleet.profiling.callback.ProfileCallback` when ``TENSORFLEET_PROFILE_STEPS`` is set (directory
``TENSORFLEET_PROFILE_DIR``, default ``profile``), and an empty list otherwise.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from tensorfleet.validation import integer, renamed

__all__ = ["StepRange", "Capture", "capture", "callbacks", "task_directory", "ENV_STEPS", "ENV_DIR"]

ENV_STEPS = "TENSORFLEET_PROFILE_STEPS"
ENV_DIR = "TENSORFLEET_PROFILE_DIR"
STEP_NAME = "train"


@dataclass(frozen=True)
class StepRange:
    """Steps ``first`` to ``last``, both included."""

    first: int
    last: int

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.first <= step <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    @classmethod
    def parse(cls, value: Any, *, name: str = "steps") -> StepRange:
        """A step range from ``"20-30"``, ``"25"``, ``25``, ``range(20, 31)`` or a :class:`StepRange`.

        Example:
            >>> StepRange.parse("20-30"), StepRange.parse(range(5, 8))
            (StepRange(first=20, last=30), StepRange(first=5, last=7))
            >>> StepRange.parse("30-20")
            Traceback (most recent call last):
            ValueError: steps must be a step range FIRST-LAST with FIRST <= LAST, such as '20-30'. Received:
            steps='30-20'
        """
        if isinstance(value, StepRange):
            return value
        if isinstance(value, range) and value.step == 1 and len(value):
            return cls(integer(name, value.start, minimum=0), value.stop - 1)
        if isinstance(value, str):
            text = value.strip()
            first, sep, last = text.partition("-")
            try:
                bounds = (int(first), int(last) if sep else int(first))
            except ValueError:
                bounds = None
            if bounds and 0 <= bounds[0] <= bounds[1]:
                return cls(*bounds)
        elif not isinstance(value, (range, bool)) and isinstance(value, int) and value >= 0:
            return cls(int(value), int(value))
        raise ValueError(f"{name} must be a step range FIRST-LAST with FIRST <= LAST, such as '20-30'. "
                         f"Received: {name}={value!r}")


@renamed(logdir="out_dir")
def task_directory(out_dir: str | os.PathLike[str], task: str | None = None,
                   environ: Mapping[str, str] | None = None) -> Path:
    """``out_dir/<task>``: ``task`` if given, else ``<role>-<index>`` from TF_CONFIG, else ``local``.

    Example:
        >>> env = {"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
        ...        '"task": {"type": "worker", "index": 1}}'}
        >>> task_directory("profile", environ=env).as_posix()
        'profile/worker-1'
    """
    from tensorfleet.strategies.tf_config import tf_config_from_env

    if task is None:
        config = tf_config_from_env(environ)
        task = f"{config.task.role}-{config.task.index}" if config and config.task else "local"
    if not task or "/" in task or task in (".", ".."):
        raise ValueError(f"task must be a folder name such as 'worker-1'. Received: task={task!r}")
    return Path(out_dir) / task


class Capture:
    """The profiler, on for the steps of ``steps`` only (see :func:`capture`).

    With a parameter-server job's ``ClusterCoordinator`` (:meth:`coordinate`) the workers and ps
    tasks are recorded too, each into its own folder beside this one (see
    :mod:`tensorfleet.profiling.remote`): :meth:`start` first waits for the steps already scheduled,
    :meth:`stop` for the chosen ones and then for the other tasks' traces.
    """

    @renamed(directory="out_dir")
    def __init__(self, out_dir: Path, steps: StepRange | None) -> None:
        self.directory = out_dir  # the folder this task's trace goes to
        self.steps = steps
        self.running = False
        self.recorded: list[int] = []
        self.coordinator: Any = None
        self.remote: Any = None
        self._first_mark = (0.0, 0)  # when the first noted step ended, and the steps done then
        self._done = 0

    def coordinate(self, coordinator: Any) -> None:
        """Records the worker and ps tasks of ``coordinator``'s job too; nothing changes for other jobs."""
        from tensorfleet.profiling.remote import RemoteCapture, remote_tasks

        tasks = remote_tasks(getattr(coordinator, "strategy", None))
        if tasks and self.steps is None:
            raise ValueError("Recording a parameter-server job needs the steps to record (steps='20-30'): its "
                             "workers are traced for a fixed time. Received: steps=None")
        self.coordinator = coordinator if tasks else None
        self.remote = RemoteCapture(self.directory.parent, tasks) if tasks else None
        self._first_mark, self._done = (0.0, 0), 0

    def mark(self, done: int) -> None:
        """Notes that ``done`` steps have ended; the pace since the first note sizes the remote traces
        (a job with no remote tasks needs none)."""
        if self.remote is None:
            return
        if not self._first_mark[1]:
            self._first_mark = (time.monotonic(), done)
        self._done = done

    def _start_remote(self) -> None:
        from tensorfleet.profiling.remote import trace_duration_ms

        self.coordinator.join()  # no step scheduled before the chosen ones runs inside the traces
        began, at = self._first_mark  # the first step also traced the step function: its time is left out
        pace = (time.monotonic() - began) / (self._done - at) if at and self._done > at else None
        assert self.steps is not None  # coordinate() refuses a parameter-server job without steps
        self.remote.start(trace_duration_ms(self.steps.last - self.steps.first + 1, pace))

    def start(self) -> None:
        import tensorflow as tf

        if not self.running:
            if self.remote is not None and not self.remote.started:
                self._start_remote()
            self.directory.mkdir(parents=True, exist_ok=True)
            tf.profiler.experimental.start(str(self.directory))
            self.running = True

    def stop(self) -> None:
        import tensorflow as tf

        if self.running:
            if self.remote is not None:
                self.coordinator.join()  # the chosen steps end inside the traces
            self.running = False
            tf.profiler.experimental.stop()
        if self.remote is not None and self.remote.started:
            self.remote.finish()
            self.remote = None

    @contextlib.contextmanager
    def step(self, number: int) -> Iterator[None]:
        """Runs one training step of a custom loop; records it when ``number`` is a chosen step."""
        if self.steps is None or number not in self.steps:
            yield
            self.mark(number + 1)
            return
        from tensorfleet.compat.profiler import step_trace

        self.start()
        with step_trace(STEP_NAME, number):
            yield
        self.recorded.append(number)
        if number >= self.steps.last:
            self.stop()


@contextlib.contextmanager
@renamed(logdir="out_dir")
def capture(out_dir: str | os.PathLike[str], steps: Any = None, *, task: str | None = None,
            coordinator: Any = None) -> Iterator[Capture]:
    """Records a profiler trace into ``out_dir/<task>``.

    Without ``steps`` the whole block is recorded (``fit`` marks its own steps). With ``steps``,
    wrap each step of a custom loop in ``cap.step(n)``: only the chosen steps are recorded, and
    outside them the profiler is off. With the ``ClusterCoordinator`` of a parameter-server job
    (and ``steps``), its workers and ps tasks are recorded too, one folder each beside this task's.

    Example:
        >>> import tensorfleet as tfl
        >>> with tfl.profiling.capture("profile/", steps="20-30") as cap:   # doctest: +SKIP
        ...     for n, batch in enumerate(dataset):
        ...         with cap.step(n):
        ...             train_step(batch)
        >>> tfl.profiling.analyze("profile/").verdict                       # doctest: +SKIP
    """
    chosen = None if steps is None else StepRange.parse(steps)
    session = Capture(task_directory(out_dir, task), chosen)
    if coordinator is not None:
        session.coordinate(coordinator)
    if chosen is None:
        session.start()
    try:
        yield session
    finally:
        session.stop()


def callbacks(environ: Mapping[str, str] | None = None) -> list[Any]:
    """``[ProfileCallback]`` when ``TENSORFLEET_PROFILE_STEPS`` is set in the environment, else ``[]``.

    Example:
        >>> callbacks({})
        []
    """
    env = os.environ if environ is None else environ
    steps = env.get(ENV_STEPS, "").strip()
    if not steps:
        return []
    from tensorfleet.profiling.callback import ProfileCallback

    return [ProfileCallback(env.get(ENV_DIR) or "profile", StepRange.parse(steps, name=ENV_STEPS),
                            task=task_directory("", environ=env).name)]
