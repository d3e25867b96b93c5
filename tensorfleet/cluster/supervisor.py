"""The launcher's supervision loop, as a small state machine.

::

    RUNNING --a task failed, or the attempt hung--> FAILED
    RUNNING --every trainer exited 0 (or 75)------> FINISHING --> finished (after the evaluator)
    RUNNING --SIGINT/SIGTERM to the launcher------> INTERRUPTED --> interrupted (75: stopped to move)
    RUNNING --stop_when matched-------------------> STOPPING --> stopped on purpose
    FAILED  --restart limit reached---------------> GIVING_UP --> failed
    FAILED  --a worker of a parameter-server job--> RESTARTING_TASK --> RUNNING
    FAILED  --otherwise---------------------------> RESTARTING_JOB --> RUNNING

Every state is one short method that returns the next state, or a :class:`JobOutcome` when the
job is over. A multi-worker mirrored (collective) job restarts every task, because the
collective group must be rebuilt with all members; a parameter-server job restarts only a
failed worker, which ``ClusterCoordinator`` tolerates. Restarts wait ``backoff`` seconds,
doubled for each further restart, at most ``max_backoff``. When training has finished, an
evaluator still at work is told so and waited for (at most ``evaluator_timeout`` seconds): it
evaluates the last checkpoint and exits by itself.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterator, NamedTuple, Union

from tensorfleet.cluster.contract import HUNG_STATUS, STOPPED_STATUS, describe_exit, shell_status
from tensorfleet.cluster.processes import LocalJob

__all__ = ["JobOutcome", "JobState", "Supervisor", "TaskFailure", "forwarded_signals"]

_POLL_SECONDS = 0.05
EVALUATOR = "evaluator:0"


class JobState(str, Enum):
    """The states of a supervised job."""

    RUNNING = "running"
    FAILED = "failed"
    RESTARTING_TASK = "restarting_task"
    RESTARTING_JOB = "restarting_job"
    FINISHING = "finishing"
    INTERRUPTED = "interrupted"
    STOPPING = "stopping"
    GIVING_UP = "giving_up"


@dataclass(frozen=True)
class JobOutcome:
    """How a supervised job ended: its status, why it failed (if it did), stopped on purpose."""

    returncode: int
    restarts: int
    error: str | None = None
    stopped: bool = False


class TaskFailure(NamedTuple):
    """Why an attempt failed: the task blamed, its exit status and a description for the log."""

    task: str
    code: int
    description: str


class Supervisor:
    """Watches a :class:`~tensorfleet.cluster.processes.LocalJob` until it ends; see the module doc."""

    def __init__(self, job: LocalJob, *, max_restarts: int, backoff: float, max_backoff: float,
                 timeout: float | None, hang_timeout: float | None, grace: float, received: list[int],
                 evaluator_timeout: float = 300.0) -> None:
        self.job = job
        self.max_restarts, self.backoff, self.max_backoff = max_restarts, backoff, max_backoff
        self.timeout, self.hang_timeout, self.grace = timeout, hang_timeout, grace
        self.evaluator_timeout = evaluator_timeout
        self.received = received  # signals the launcher got, filled by its handler
        self.restarts = 0
        self.attempt = 0  # the attempt every task started with; a task restarted alone keeps it
        self.attempt_start = 0.0
        self.done: set[str] = set()  # tasks of this attempt that exited 0 or STOPPED_STATUS
        self.stopped: set[str] = set()  # ... of those, the ones that stopped on purpose
        self.failure: TaskFailure | None = None
        self.steps: dict[JobState, Callable[[], JobState | JobOutcome]] = {
            JobState.RUNNING: self.watch,
            JobState.FAILED: self.on_failure,
            JobState.RESTARTING_TASK: self.restart_task,
            JobState.RESTARTING_JOB: self.restart_job,
            JobState.FINISHING: self.finish,
            JobState.INTERRUPTED: self.interrupt,
            JobState.STOPPING: self.stop,
            JobState.GIVING_UP: self.give_up,
        }

    def run(self) -> JobOutcome:
        """Starts the job and steps through the states until one returns the outcome."""
        self._start_attempt(0)
        step: Union[JobState, JobOutcome] = JobState.RUNNING
        while isinstance(step, JobState):
            step = self.steps[step]()
        return step

    # States ---------------------------------------------------------------------------
    def watch(self) -> JobState:
        time.sleep(_POLL_SECONDS)
        if self.received:
            return JobState.INTERRUPTED
        if self.job.stop_requested.is_set():
            return JobState.STOPPING
        self.failure = self._failed_task()
        if self.job.stop_requested.is_set():  # a task's exit may follow the planned stop
            return JobState.RUNNING
        self.failure = self.failure or self._hung()
        if self.failure is not None:
            return JobState.FAILED
        return JobState.FINISHING if self.job.trainers <= self.done else JobState.RUNNING

    def on_failure(self) -> JobState:
        assert self.failure is not None
        task, code = self.failure.task, self.failure.code
        if self.restarts >= self.max_restarts or not self.job.restartable(task, code):
            return JobState.GIVING_UP
        self.restarts += 1
        return JobState.RESTARTING_TASK if self.job.restarts_alone(task, code) else JobState.RESTARTING_JOB

    def restart_task(self) -> JobState:
        assert self.failure is not None
        name, delay = self.failure.task, self.restart_delay()
        self.job.event(f"{self.failure.description}; restarting {name} only "
                       f"(restart {self.restarts}/{self.max_restarts}) in {delay:g}s")
        self.job.tasks[name].reap(0.0)
        time.sleep(delay)
        role, index = name.split(":")
        self.job.start_task(role, int(index), self.restarts)
        self.job.event(f"restarted {name} (attempt {self.restarts})")
        return JobState.RUNNING

    def restart_job(self) -> JobState:
        assert self.failure is not None
        delay = self.restart_delay()
        self.job.event(f"{self.failure.description}; restarting all {self.job.spec.num_tasks()} tasks "
                       f"(restart {self.restarts}/{self.max_restarts}) in {delay:g}s")
        self.job.stop_all(signal.SIGKILL, 0.0)
        self.job.tasks.clear()
        time.sleep(delay)
        self._start_attempt(self.restarts)
        self.job.event(f"restarted the job (attempt {self.restarts})")
        return JobState.RUNNING

    def finish(self) -> JobOutcome:
        self._await_evaluator()
        if self.received:
            return self.interrupt()
        # Servers (ps, and workers of a ps job) never end on their own.
        if any(t.poll() is None for n, t in self.job.tasks.items() if n not in self.done):
            self.job.stop_all(signal.SIGTERM, self.grace)
        if self.stopped:
            self.job.event(f"the job stopped as planned ({', '.join(sorted(self.stopped))} exited with "
                           f"status {STOPPED_STATUS})")
        return JobOutcome(0, self.restarts, stopped=bool(self.stopped))

    def interrupt(self) -> JobOutcome:
        """The signal went to every task; the trainers get ``grace`` seconds first. When every trainer
        exited with STOPPED_STATUS (a migratable job stops at a step boundary, checkpoint written), the
        job stopped to move: the rest (servers that outlive the signal) are killed, the status is 75."""
        signum = self.received[0]
        name = signal.Signals(signum).name
        self.job.event(f"received {name}; stopping all tasks")
        trainers = [task for task_name, task in self.job.tasks.items() if task_name in self.job.trainers]
        for task in trainers:
            task.reap(self.grace)
        if trainers and all(task.proc.returncode == STOPPED_STATUS for task in trainers):
            self.job.stop_all(signal.SIGKILL, 0.0)
            self.job.event(f"the job stopped to move (every trainer exited with status {STOPPED_STATUS} after "
                           "the signal)")
            return JobOutcome(STOPPED_STATUS, self.restarts, stopped=True)
        self.job.stop_all(signum, self.grace)
        return JobOutcome(shell_status(-signum), self.restarts, f"Interrupted by {name}.")

    def stop(self) -> JobOutcome:
        self.job.stop_all(signal.SIGTERM, self.grace)
        return JobOutcome(0, self.restarts, stopped=True)

    def give_up(self) -> JobOutcome:
        assert self.failure is not None
        name, code, description = self.failure
        limit = f"restart limit reached ({self.restarts} of max_restarts={self.max_restarts})"
        self.job.event(f"{description}; {limit}")
        self.job.stop_all(signal.SIGTERM, self.grace)
        task = self.job.tasks.get(name)
        tail = "\n".join(f"  [{name}] {line}" for line in task.tail) if task is not None else ""
        message = f"The job failed: {description}; {limit}. Last output of {name}:\n{tail}"
        return JobOutcome(shell_status(code) or 1, self.restarts, message)

    # Helpers --------------------------------------------------------------------------
    def _await_evaluator(self) -> None:
        """Tells the evaluator that training has ended, then gives it up to ``evaluator_timeout``
        seconds to evaluate the last checkpoint and exit by itself."""
        evaluator = self.job.tasks.get(EVALUATOR)
        if evaluator is None:
            return
        self.job.announce_training_ended()
        if evaluator.poll() is None:
            self.job.event(f"training ended; waiting up to {self.evaluator_timeout:g}s (evaluator_timeout) for "
                           f"{EVALUATOR} to evaluate the last checkpoint")
            deadline = time.monotonic() + self.evaluator_timeout
            while evaluator.poll() is None and not self.received and time.monotonic() < deadline:
                time.sleep(_POLL_SECONDS)
        code = evaluator.poll()
        if code is None and not self.received:
            self.job.event(f"{EVALUATOR} did not finish within evaluator_timeout={self.evaluator_timeout:g}s; "
                           "stopping it (its last checkpoint may be unevaluated)")
        elif code not in (None, 0):
            evaluator.reader.join(timeout=2.0)
            self.job.event(f"{EVALUATOR} {describe_exit(code)} after training ended; its last evaluation may be "
                           "missing (its output above says why)")

    def _start_attempt(self, attempt: int) -> None:
        self.attempt = attempt
        self.done.clear()
        self.stopped.clear()
        self.job.start_all(attempt)
        self.attempt_start = time.monotonic()

    def _failed_task(self) -> TaskFailure | None:
        """The first task that exited with a failure; records the ones that ended well."""
        for name, task in list(self.job.tasks.items()):
            code = task.poll()
            if code is None or name in self.done:
                continue
            task.reader.join(timeout=2.0)  # its last lines (and any fault match) first
            if code in (0, STOPPED_STATUS):  # STOPPED_STATUS: a planned stop after a backup
                self.done.add(name)
                if code == STOPPED_STATUS:
                    self.stopped.add(name)
                continue
            if self.job.stop_requested.is_set():
                return None
            return TaskFailure(name, code, f"{name} {describe_exit(code)}")
        return None

    def _hung(self) -> TaskFailure | None:
        now, lead = time.monotonic(), self.job.lead
        if self.timeout is not None and now - self.attempt_start > self.timeout:
            return TaskFailure(lead, HUNG_STATUS, f"attempt {self.attempt} ran longer than timeout={self.timeout:g}s")
        if self.hang_timeout is not None and now - self.job.activity > self.hang_timeout:
            return TaskFailure(lead, HUNG_STATUS,
                            f"no task printed anything for hang_timeout={self.hang_timeout:g}s (hung)")
        return None

    def restart_delay(self) -> float:
        """Seconds before the current restart: ``backoff`` doubled per earlier restart, at most ``max_backoff``."""
        return min(self.max_backoff, self.backoff * (2 ** (self.restarts - 1)))


@contextlib.contextmanager
def forwarded_signals(job: LocalJob) -> Iterator[list[int]]:
    """Forwards SIGINT and SIGTERM to every task while the block runs (in the main thread only:
    Python installs signal handlers there) and yields the list of signals received."""
    received: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        received.append(signum)
        job.forward(signum)

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, handler)
    try:
        yield received
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
