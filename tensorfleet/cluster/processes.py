"""The processes of a launched job: one per task, each leading its own process group, with a
thread that prefixes and records its output, and the faults injected into them (set by tensorfleet's
own tests and benchmarks through :func:`tensorfleet.testing.faults`, read here from its hook point).

A task's output is read as it comes, not line by line, so that a progress bar redrawn with
``\r`` (Keras' ``fit``) shows as its state every few seconds, one line each, instead of one
line of every redraw at the end of the epoch (:class:`~tensorfleet.cluster.console.ProgressLines`);
TensorFlow's known start-up noise (:func:`~tensorfleet.cluster.console.is_noise`) is left out
of what is shown unless the job is ``verbose``.

A task's process dies with the launcher (Linux ``PR_SET_PDEATHSIG``), even when the launcher
is SIGKILLed; signals reach the task's whole group, so its own children stop with it.
"""

from __future__ import annotations

import codecs
import collections
import contextlib
import ctypes
import io
import operator
import os
import re
import signal
import subprocess
import sys
import threading
import time
from enum import Enum
from typing import Callable

from tensorfleet.cluster.console import ProgressLines, is_noise
from tensorfleet.cluster.contract import (
    ENV_ATTEMPT,
    ENV_NUM_WORKERS,
    ENV_TASK,
    ENV_TRAINING_ENDED,
    HUNG_STATUS,
    SERVE_ARGS,
)
from tensorfleet.cluster.result import LogLine, TaskSpan
from tensorfleet.strategies.tf_config import ClusterSpec, Role
from tensorfleet.testing.hooks import Fault, active
from tensorfleet.validation import renamed

__all__ = ["JobMode", "LocalJob", "TaskProcess"]

_TAIL_LINES = 30
_PR_SET_PDEATHSIG = 1


class JobMode(str, Enum):
    """How a job's tasks depend on each other, which decides what a restart restarts."""

    AUTO = "auto"
    COLLECTIVE = "collective"  # multi-worker mirrored: restart all tasks
    PARAMETER_SERVER = "parameter_server"  # restart only a failed worker


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Linux only: the kernel kills the task if the launcher dies, even by SIGKILL.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class TaskProcess:
    """One running process of the job, with a thread that prefixes and records its output."""

    def __init__(self, job: "LocalJob", role: str, index: int, argv: list[str], env: dict[str, str],
                 attempt: int) -> None:
        self.job, self.role, self.index, self.attempt = job, role, index, attempt
        self.name = f"{role}:{index}"
        self.reaped = False
        self.started = job.now()
        self.ended: float | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.proc = subprocess.Popen(  # noqa: S603 - argv is built here, never a shell string
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self.reader = threading.Thread(target=self._read, name=f"tensorfleet-{self.name}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert isinstance(stdout, io.BufferedReader)  # stdout=PIPE, binary: read1 returns what has come
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        lines = ProgressLines(interval=self.job.progress_interval)
        for raw in iter(lambda: stdout.read1(65536), b""):
            self._show(lines.feed(decoder.decode(raw), now=self.job.now()))
        self._show(lines.feed(decoder.decode(b"", final=True), now=self.job.now()) + lines.flush())
        stdout.close()

    def _show(self, lines: list[tuple[str, bool]]) -> None:
        for text, complete in lines:
            if not complete:
                self.job.on_progress(self, text)
                continue
            if self.job.verbose or not is_noise(text):
                self.tail.append(text)
            self.job.on_line(self, text)

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = self.job.now()
        return code

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Signals the task's whole process group (so its children too), unless already reaped."""
        if not self.reaped:  # after reaping, the group id may belong to someone else
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signum)

    def reap(self, grace: float) -> int:
        """Waits up to ``grace`` s, then SIGKILLs the group; always reaps the process."""
        try:
            code = self.proc.wait(timeout=max(grace, 0.0))
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            code = self.proc.wait()
        if self.ended is None:
            self.ended = self.job.now()
        # The leader may be gone while others of its group live on (e.g. a helper binary).
        self.kill(signal.SIGKILL)
        self.reaped = True
        self.reader.join(timeout=5.0)
        return code

    def span(self) -> TaskSpan:
        end = self.ended if self.ended is not None else self.job.now()
        return TaskSpan(self.name, self.attempt, self.started, end, self.proc.returncode)


class LocalJob:
    """The processes, output and events of one launched job on this machine."""

    #: Who the job's own events come from, in the log (``[launcher] restarted the job``).
    name = "launcher"

    @renamed(sink="log", quiet=("verbose", operator.not_))
    def __init__(self, *, spec: ClusterSpec, mode: JobMode, argv: list[str], env: dict[str, str],
                 log: Callable[[str], None] | None, stop_when: str | None,
                 verbose: bool = False, progress_interval: float = 2.0) -> None:
        self.spec, self.mode, self.argv, self.base_env = spec, mode, argv, env
        # Created (empty) once every trainer has finished; the evaluator stops when it sees it.
        self.training_ended_file = env.get(ENV_TRAINING_ENDED)
        self.log = log
        self.verbose, self.progress_interval = verbose, progress_interval
        self.faults = list(active().faults)  # tensorfleet.testing's, for the jobs launched while it is set
        self.fired: set[int] = set()
        self.stop_regex = re.compile(stop_when) if stop_when else None
        self.stop_requested = threading.Event()
        self.activity = time.monotonic()
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.lines: list[LogLine] = []
        self.events: list[LogLine] = []
        self.tasks: dict[str, TaskProcess] = {}
        self.history: list[TaskProcess] = []
        # The chief (worker 0 without one) writes the backups and decides the job's status.
        self.lead = "chief:0" if spec.num_tasks(Role.CHIEF.value) else "worker:0"
        # Tasks whose success completes the job; the others (servers, evaluator) are then stopped.
        self.trainers = ({"chief:0"} if mode is JobMode.PARAMETER_SERVER else
                         {str(t) for t in spec.tasks() if t.role in (Role.CHIEF.value, Role.WORKER.value)})

    # Output ---------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.start

    def on_progress(self, task: TaskProcess, text: str) -> None:
        """A progress bar's current state: shown, not recorded (its final state is a line)."""
        self.activity = time.monotonic()
        if self.log is not None:
            with self.lock:
                self.log(f"[{task.name}] {text}")

    def shown(self, task: TaskProcess, text: str) -> str | None:
        """What of a task's line reaches ``log`` (None: nothing); every line is recorded anyway."""
        return text if self.verbose or not is_noise(text) else None

    def on_line(self, task: TaskProcess, text: str) -> None:
        self.activity = time.monotonic()
        with self.lock:
            self.lines.append(LogLine(self.now(), task.name, task.attempt, text))
            show = self.shown(task, text)
            if self.log is not None and show is not None:
                self.log(f"[{task.name}] {show}")
        for i, fault in enumerate(self.faults):
            if (i not in self.fired and (fault.watch or fault.task) == task.name
                    and fault.attempt == task.attempt and re.search(fault.when, text)):
                target = self.tasks.get(fault.task)
                if target is None or target.poll() is not None:
                    continue
                self.fired.add(i)
                threading.Timer(fault.delay, self._inject, (fault, target, task.name)).start()
        if (self.stop_regex is not None and task.name == self.lead and self.stop_regex.search(text)
                and not self.stop_requested.is_set()):
            self.event(f"stopping the job: {task.name} printed a line matching {self.stop_regex.pattern!r}")
            self.stop_requested.set()

    def _inject(self, fault: Fault, target: TaskProcess, seen_in: str) -> None:
        if target.poll() is not None or self.stop_requested.is_set():
            return
        self.event(f"injecting fault: {signal.Signals(fault.signal).name} to {fault.task} "
                   f"({seen_in} printed a line matching {fault.when!r})")
        target.kill(fault.signal)

    def event(self, text: str) -> None:
        with self.lock:
            self.events.append(LogLine(self.now(), self.name, -1, text))
            if self.log is not None:
                self.log(f"[{self.name}] {text}")

    # Restart policy (the supervisor asks) ----------------------------------------------
    def restartable(self, task: str, code: int) -> bool:
        """Whether a failure of ``task`` (exit status ``code``) may be mended by a restart."""
        return True

    def restarts_alone(self, task: str, code: int) -> bool:
        """Whether restarting ``task`` alone mends its failure (else every task restarts).

        A parameter-server job's worker can: ``ClusterCoordinator`` runs its closures on the
        other workers until it is back. A hung attempt restarts whole.
        """
        return (self.mode is JobMode.PARAMETER_SERVER and task.split(":")[0] == Role.WORKER.value
                and code != HUNG_STATUS)

    # Processes ------------------------------------------------------------------------
    def serves(self, role: str) -> bool:
        """Whether tasks of ``role`` run a server rather than the script (workers and ps of a parameter-server job)."""
        return self.mode is JobMode.PARAMETER_SERVER and role in (Role.WORKER.value, Role.PS.value)

    def task_argv(self, role: str) -> list[str]:
        return [sys.executable, *SERVE_ARGS] if self.serves(role) else self.argv

    def start_task(self, role: str, index: int, attempt: int) -> TaskProcess:
        env = dict(self.base_env)
        env["TF_CONFIG"] = self.spec.tf_config_json(role, index)
        env[ENV_TASK] = f"{role}:{index}"
        env[ENV_ATTEMPT] = str(attempt)
        env[ENV_NUM_WORKERS] = str(self.spec.num_tasks(Role.WORKER.value))
        env["PYTHONUNBUFFERED"] = "1"
        task = TaskProcess(self, role, index, self.task_argv(role), env, attempt)
        self.tasks[task.name] = task
        self.history.append(task)
        return task

    def start_all(self, attempt: int) -> None:
        for task in self.spec.tasks():
            self.start_task(task.role, task.index, attempt)
        self.activity = time.monotonic()

    def stop_all(self, signum: int, grace: float) -> None:
        """Sends ``signum`` to every live task, then reaps all (SIGKILL after ``grace`` s); servers last and
        without waiting: once the others are gone they hold nothing (a migratable job's ignore SIGTERM)."""
        self.forward(signum)
        tasks = list(self.tasks.values())
        for task in tasks:
            if not self.serves(task.role):
                task.reap(grace)
        for task in tasks:
            if self.serves(task.role):
                task.reap(0.0)

    def forward(self, signum: int) -> None:
        for task in list(self.tasks.values()):
            if task.poll() is None:
                task.kill(signum)

    def announce_training_ended(self) -> None:
        """Creates the file that tells the evaluator (``ENV_TRAINING_ENDED``) training has ended."""
        if self.training_ended_file:
            with open(self.training_ended_file, "a"):
                pass

    def spans(self) -> list[TaskSpan]:
        return [task.span() for task in self.history]
