"""Local multi-process launcher: one process per task of a tf.distribute cluster.

TensorFlow ships no launcher (PyTorch has ``torchrun``, Horovod ``horovodrun``). :func:`launch`
starts one process per task on 127.0.0.1 with free ports and each task's TF_CONFIG (from
:class:`~tensorfleet.strategies.tf_config.ClusterSpec`), prefixes every output line with the
task (``[worker:1] ...``), forwards SIGINT/SIGTERM to every task's process group, and ends
with the chief's exit status (worker 0's when there is no chief) or the first failure's.

When a task dies the job is restarted, up to ``max_restarts`` times with exponential backoff:

* multi-worker mirrored (collective) jobs restart every task, because the collective group
  must be rebuilt with all members;
* parameter-server jobs restart only a failed worker, which TensorFlow's
  ``ClusterCoordinator`` tolerates (its closures are re-run on the other workers until the
  worker is back); a failed chief or ps restarts the job.

A collective that hangs because a peer is gone is ended by the launcher noticing the dead
peer (it stops the survivors at once instead of letting them wait), by the script's own
``CommunicationOptions(timeout_seconds=...)``, or, for tasks that neither exit nor print,
by ``hang_timeout``: no output from any task for that long counts as a failure.

SIGTERM alone does not end a multi-worker TensorFlow task: TensorFlow's preemption notifier
catches it (the coordination service treats it as a preemption notice), so after forwarding
SIGINT or SIGTERM the launcher waits ``grace`` seconds and then SIGKILLs what is left.

In a parameter-server job only the chief runs the script; workers and ps run the built-in
server of this module (``python -m tensorfleet.cluster.launcher --serve``), which sets
``inter_op_parallelism_threads`` to ``workers + 1`` (without it a 2-core machine hangs in
the first epoch).

Example:
    >>> from tensorfleet.cluster import launcher
    >>> result = launcher.launch("train.py", workers=2, max_restarts=2)  # doctest: +SKIP
    >>> result.returncode, result.restarts  # doctest: +SKIP
    (0, 0)
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tensorfleet.netbind import loopback_env
from tensorfleet.strategies.tf_config import ClusterSpec, Role, TFConfigError, parse_tf_config
from tensorfleet.validation import choice

__all__ = [
    "Fault",
    "JobMode",
    "LaunchError",
    "LaunchFailedError",
    "LaunchResult",
    "LogLine",
    "TaskSpan",
    "PortInUseError",
    "STOPPED_STATUS",
    "TFConfigConflictError",
    "launch",
]

#: Environment variables every task gets besides TF_CONFIG.
ENV_TASK = "TENSORFLEET_TASK"
ENV_ATTEMPT = "TENSORFLEET_ATTEMPT"
ENV_NUM_WORKERS = "TENSORFLEET_NUM_WORKERS"
ENV_BACKUP_DIR = "TENSORFLEET_BACKUP_DIR"
#: Exit status of a task that stopped on purpose after a backup (``EX_TEMPFAIL``: resume later).
STOPPED_STATUS = 75

_LOCALHOST = "127.0.0.1"
_TAIL_LINES = 30


class JobMode(str, Enum):
    """How a job's tasks depend on each other, which decides what a restart restarts."""

    AUTO = "auto"
    COLLECTIVE = "collective"  # multi-worker mirrored: restart all tasks
    PARAMETER_SERVER = "parameter_server"  # restart only a failed worker


class LaunchError(RuntimeError):
    """A job could not be started or did not complete."""


class LaunchFailedError(LaunchError):
    """The job failed and the restart limit is reached; ``result`` holds the whole record."""

    def __init__(self, message: str, result: "LaunchResult") -> None:
        super().__init__(message)
        self.result = result


class PortInUseError(LaunchError, ValueError):
    """A task's port is already taken on 127.0.0.1."""


class TFConfigConflictError(TFConfigError):
    """TF_CONFIG is already set in the environment and names another cluster."""


@dataclass(frozen=True)
class Fault:
    """A fault to inject, for tests and benchmarks of recovery.

    When task ``watch`` (default: ``task`` itself) prints a line matching ``when`` during
    attempt ``attempt``, the launcher sends ``signal`` to the process group of ``task``
    (``"worker:1"``), ``delay`` seconds later.
    """

    task: str
    when: str
    signal: int = signal.SIGKILL
    attempt: int = 0
    watch: str | None = None
    delay: float = 0.0


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
                ax.text(span.end, row, f" {_describe_exit(span.status).split(' ', 1)[1]}", va="center", fontsize=7)
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

    def first_time(self, pattern: str, *, task: str | None = None, after: float = 0.0) -> float | None:
        """Time (s since launch) of the first line matching ``pattern`` after ``after``."""
        regex = re.compile(pattern)
        for line in self.lines:
            if line.time >= after and (task is None or line.task == task) and regex.search(line.text):
                return line.time
        return None


# --------------------------------------------------------------------------- validation


def _check_count(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be a {kind} integer. Received: {name}={value!r}")
    return value


def _check_script(script: str | os.PathLike[str]) -> Path:
    path = Path(script)
    if not path.exists():
        raise FileNotFoundError(f"The script to launch does not exist. Received: script={str(script)!r}")
    if not path.is_file():
        raise FileNotFoundError(f"The script to launch is not a file. Received: script={str(script)!r}")
    return path.resolve()


def _check_ports_free(spec: ClusterSpec) -> None:
    for task in spec.tasks():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((_LOCALHOST, task.port))
            except OSError:
                raise PortInUseError(
                    f"Port {task.port} of {task} is already in use on {_LOCALHOST}. "
                    "Choose other ports, or leave ports unset to pick free ones."
                ) from None


def _check_env_tf_config(spec: ClusterSpec, env: Mapping[str, str]) -> None:
    raw = env.get("TF_CONFIG", "")
    if not raw.strip():
        return
    where = "the environment"
    try:
        existing = parse_tf_config(raw)
    except TFConfigError as exc:
        raise TFConfigConflictError(
            f"TF_CONFIG is already set in {where} and is not valid ({exc}); the launcher sets "
            "each task's TF_CONFIG itself. Unset TF_CONFIG before launching."
        ) from None
    if existing.cluster.as_dict() != spec.as_dict():
        raise TFConfigConflictError(
            f"TF_CONFIG is already set in {where} with another cluster "
            f"({json.dumps(existing.cluster.as_dict())}) than the one the launcher starts "
            f"({json.dumps(spec.as_dict())}). Unset TF_CONFIG before launching, or pass its "
            "ports to launch(ports=...)."
        )


def _parse_task(name: str) -> tuple[str, int]:
    match = re.fullmatch(r"(chief|worker|ps|evaluator):(\d+)", name)
    if not match:
        raise ValueError(f"A task is named 'role:index', e.g. 'worker:1'. Received: {name!r}")
    return match.group(1), int(match.group(2))


# --------------------------------------------------------------------------- processes

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Linux only: the kernel kills the task if the launcher dies, even by SIGKILL.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    # Each task leads its own process group, so this reaches its children too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


def _exit_status(code: int) -> int:
    """A shell-style status: 128 + signal number for a task killed by a signal."""
    return 128 + (-code) if code < 0 else code


class _Task:
    """One running process of the job, with a thread that prefixes and records its output."""

    def __init__(self, job: "_Job", role: str, index: int, argv: list[str], env: dict[str, str],
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
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.tail.append(text)
            self.job.on_line(self, text)
        self.proc.stdout.close()

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = self.job.now()
        return code

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if not self.reaped:  # after reaping, the group id may belong to someone else
            _signal_group(self.proc, signum)

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


class _Job:
    """The state of one :func:`launch` call."""

    def __init__(self, *, spec: ClusterSpec, mode: JobMode, argv: list[str], env: dict[str, str],
                 sink: Callable[[str], None] | None, faults: Sequence[Fault], stop_when: str | None) -> None:
        self.spec, self.mode, self.argv, self.base_env = spec, mode, argv, env
        self.sink = sink
        self.faults = list(faults)
        self.fired: set[int] = set()
        self.stop_regex = re.compile(stop_when) if stop_when else None
        self.stop_requested = threading.Event()
        self.activity = time.monotonic()
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.lines: list[LogLine] = []
        self.events: list[LogLine] = []
        self.tasks: dict[str, _Task] = {}
        self.history: list[_Task] = []
        self.lead = _lead_task(spec)

    # Output ---------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.start

    def on_line(self, task: _Task, text: str) -> None:
        self.activity = time.monotonic()
        with self.lock:
            self.lines.append(LogLine(self.now(), task.name, task.attempt, text))
            if self.sink is not None:
                self.sink(f"[{task.name}] {text}")
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

    def _inject(self, fault: Fault, target: _Task, seen_in: str) -> None:
        if target.poll() is not None or self.stop_requested.is_set():
            return
        self.event(f"injecting fault: {signal.Signals(fault.signal).name} to {fault.task} "
                   f"({seen_in} printed a line matching {fault.when!r})")
        target.kill(fault.signal)

    def event(self, text: str) -> None:
        with self.lock:
            self.events.append(LogLine(self.now(), "launcher", -1, text))
            if self.sink is not None:
                self.sink(f"[launcher] {text}")

    # Processes ------------------------------------------------------------------------
    def task_argv(self, role: str) -> list[str]:
        if self.mode is JobMode.PARAMETER_SERVER and role in (Role.WORKER.value, Role.PS.value):
            return [sys.executable, "-m", "tensorfleet.cluster.launcher", "--serve"]
        return self.argv

    def start_task(self, role: str, index: int, attempt: int) -> _Task:
        env = dict(self.base_env)
        env["TF_CONFIG"] = self.spec.tf_config_json(role, index)
        env[ENV_TASK] = f"{role}:{index}"
        env[ENV_ATTEMPT] = str(attempt)
        env[ENV_NUM_WORKERS] = str(self.spec.num_tasks(Role.WORKER.value))
        env["PYTHONUNBUFFERED"] = "1"
        task = _Task(self, role, index, self.task_argv(role), env, attempt)
        self.tasks[task.name] = task
        self.history.append(task)
        return task

    def start_all(self, attempt: int) -> None:
        for task in self.spec.tasks():
            self.start_task(task.role, task.index, attempt)

    def stop_all(self, signum: int, grace: float) -> dict[str, int]:
        for task in self.tasks.values():
            if task.poll() is None:
                task.kill(signum)
        codes = {name: task.reap(grace) for name, task in self.tasks.items()}
        return codes

    def forward(self, signum: int) -> None:
        for task in list(self.tasks.values()):
            if task.poll() is None:
                task.kill(signum)


# --------------------------------------------------------------------------- launch


def _resolve_mode(mode: JobMode | str, spec: ClusterSpec) -> JobMode:
    resolved = choice(JobMode, "mode", mode)
    if resolved is JobMode.AUTO:
        return JobMode.PARAMETER_SERVER if spec.num_tasks(Role.PS.value) else JobMode.COLLECTIVE
    if resolved is JobMode.PARAMETER_SERVER and not spec.num_tasks(Role.PS.value):
        raise ValueError("mode='parameter_server' needs at least one ps task. Received: ps=0")
    return resolved


def _lead_task(spec: ClusterSpec) -> str:
    return "chief:0" if spec.num_tasks(Role.CHIEF.value) else "worker:0"


def _trainers(spec: ClusterSpec, mode: JobMode) -> set[str]:
    """Tasks whose success completes the job; the others (servers, evaluator) are then stopped."""
    if mode is JobMode.PARAMETER_SERVER:
        return {"chief:0"}
    return {str(t) for t in spec.tasks() if t.role in (Role.CHIEF.value, Role.WORKER.value)}


def _default_sink(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def launch(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    workers: int = 2,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    ports: Sequence[int] | None = None,
    mode: JobMode | str = JobMode.AUTO,
    max_restarts: int = 0,
    backoff: float = 1.0,
    max_backoff: float = 30.0,
    timeout: float | None = None,
    hang_timeout: float | None = None,
    grace: float = 5.0,
    env: Mapping[str, str] | None = None,
    backup_dir: str | os.PathLike[str] | None = None,
    faults: Sequence[Fault] = (),
    stop_when: str | None = None,
    sink: Callable[[str], None] | None = _default_sink,
    check: bool = True,
    python: str | None = None,
) -> LaunchResult:
    """Runs ``script`` as a local tf.distribute cluster, one process per task.

    Args:
        script: the Python training script; every trainer task runs it with ``args``.
        args: command-line arguments for the script.
        workers: number of worker tasks (>= 1, or 0 with ``chief=True``).
        ps: number of parameter-server tasks; a ps job always gets a chief (the coordinator).
        chief: add a chief task.
        evaluator: add an evaluator task; once the trainers finish it has ``grace`` seconds
            to end by itself before it is stopped.
        ports: one port per task (chief, workers, ps, evaluator order); free ports by default.
        mode: ``"auto"`` (parameter server when ``ps > 0``, else collective), ``"collective"``
            or ``"parameter_server"``; decides what a restart restarts.
        max_restarts: how many times a failed job (or ps worker) is restarted.
        backoff: seconds before the first restart, doubled for each further one.
        max_backoff: cap of the backoff.
        timeout: seconds one attempt may run before it counts as failed (hung).
        hang_timeout: seconds without output from any task before the attempt counts as hung.
        grace: seconds tasks get after SIGTERM/SIGINT before SIGKILL.
        env: extra environment variables for every task (TF_CONFIG is set by the launcher).
        backup_dir: exported to the tasks as ``TENSORFLEET_BACKUP_DIR`` for
            :func:`tensorfleet.cluster.fault_tolerance.callbacks`.
        faults: faults to inject (tests and benchmarks of recovery).
        stop_when: a regular expression; the first line of the chief's output (worker 0's
            without a chief) matching it stops the job on purpose (SIGTERM to all tasks); the
            result then has ``stopped=True``. Only the chief's lines count because the chief
            writes the backups: a line it prints after a backup means the backup is complete.
        sink: receives every prefixed output line and launcher event; ``None`` keeps them only
            in the result.
        check: raise :class:`LaunchFailedError` when the job fails for good.
        python: the interpreter for the tasks (default: this one).

    Returns:
        A :class:`LaunchResult`: exit status (the chief's, or the first failure's), restarts,
        every output line with its task and time, and the launcher's events.

    Raises:
        FileNotFoundError: the script does not exist.
        ValueError: zero workers, a negative count, or a bad option.
        PortInUseError: a requested port is taken.
        TFConfigConflictError: TF_CONFIG is set in the environment for another cluster.
        LaunchFailedError: with ``check=True``, the job failed and the restart limit is reached;
            the message ends with the failed task's last lines of output.

    Example:
        >>> result = launch("examples/launch_hello.py", workers=2)  # doctest: +SKIP
        [worker:0] hello from worker:0 of 2
        [worker:1] hello from worker:1 of 2
    """
    script_path = _check_script(script)
    _check_count("workers", workers, minimum=0)
    _check_count("ps", ps, minimum=0)
    _check_count("max_restarts", max_restarts, minimum=0)
    if workers == 0 and not chief:
        raise ValueError("A job needs at least one worker (or a chief). Received: workers=0")
    if ps and not workers:
        raise ValueError(f"A parameter-server job needs at least one worker. Received: workers=0, ps={ps}")
    for name, value in (("backoff", backoff), ("max_backoff", max_backoff), ("grace", grace),
                        ("timeout", timeout), ("hang_timeout", hang_timeout)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"{name} must be a non-negative number of seconds. Received: {name}={value!r}")
    for fault in faults:
        _parse_task(fault.task)
        if fault.watch is not None:
            _parse_task(fault.watch)
    if ps:
        chief = True  # ParameterServerStrategy's coordinator runs as the chief
    spec = ClusterSpec.local(workers=workers, ps=ps, chief=chief, evaluator=evaluator, host=_LOCALHOST,
                             ports=list(ports) if ports is not None else None)
    job_mode = _resolve_mode(mode, spec)
    if ports is not None:
        _check_ports_free(spec)
    parent_env = dict(os.environ)
    _check_env_tf_config(spec, parent_env)
    if env and "TF_CONFIG" in env:
        raise TFConfigConflictError(
            "env must not set TF_CONFIG: the launcher gives each task its own. "
            f"Received: env['TF_CONFIG']={env['TF_CONFIG']!r}"
        )
    parent_env.pop("TF_CONFIG", None)
    parent_env.update(env or {})
    # TensorFlow's servers bind [::]:port (hard-coded); keep every task's listening sockets on
    # the loopback address the cluster names.
    bind_env = loopback_env(_LOCALHOST, environ=parent_env)
    if not bind_env:
        warnings.warn("No C compiler to build tensorfleet's bind library: the tasks' TensorFlow servers listen on "
                      "every interface, not only 127.0.0.1. Install a C compiler (cc).", RuntimeWarning, stacklevel=2)
    parent_env.update(bind_env)
    if backup_dir is not None:
        parent_env[ENV_BACKUP_DIR] = str(Path(backup_dir).resolve())
    argv = [python or sys.executable, str(script_path), *map(str, args)]

    job = _Job(spec=spec, mode=job_mode, argv=argv, env=parent_env, sink=sink, faults=faults,
               stop_when=stop_when)
    received: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        received.append(signum)
        job.forward(signum)

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous: dict[int, Any] = {}
    if in_main_thread:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, handler)
    try:
        returncode, restarts, error, stopped = _supervise(
            job, max_restarts=max_restarts, backoff=backoff, max_backoff=max_backoff, timeout=timeout,
            hang_timeout=hang_timeout, grace=grace, received=received)
    finally:
        try:
            job.stop_all(signal.SIGKILL, 0.0)
        finally:
            for signum, old in previous.items():
                signal.signal(signum, old)
    spans = [TaskSpan(t.name, t.attempt, t.started, t.ended if t.ended is not None else job.now(),
                      t.proc.returncode) for t in job.history]
    result = LaunchResult(returncode=returncode, restarts=restarts, cluster=spec, lines=list(job.lines),
                          events=list(job.events), duration=job.now(), stopped=stopped, error=error, spans=spans)
    if check and returncode != 0:
        raise LaunchFailedError(error or f"The job failed with status {returncode}.", result)
    return result


def _supervise(job: _Job, *, max_restarts: int, backoff: float, max_backoff: float, timeout: float | None,
               hang_timeout: float | None, grace: float, received: list[int]) -> tuple[int, int, str | None, bool]:
    """The monitoring loop. Returns (status, restarts, error message or None, stopped on purpose)."""
    spec, mode = job.spec, job.mode
    lead = _lead_task(spec)
    trainers = _trainers(spec, mode)
    restarts = 0
    attempt = 0
    job.start_all(attempt)
    attempt_start = time.monotonic()
    job.activity = time.monotonic()
    done: set[str] = set()
    stopped: set[str] = set()

    def restart_delay() -> float:
        return min(max_backoff, backoff * (2 ** (restarts - 1)))

    while True:
        time.sleep(0.05)
        if received:
            signum = received[0]
            job.event(f"received {signal.Signals(signum).name}; stopping all tasks")
            job.stop_all(signum, grace)
            return _exit_status(-signum), restarts, f"Interrupted by {signal.Signals(signum).name}.", False
        if job.stop_requested.is_set():
            job.stop_all(signal.SIGTERM, grace)
            return 0, restarts, None, True

        failure: tuple[str, int, str] | None = None  # (task, status, description)
        for name, task in list(job.tasks.items()):
            code = task.poll()
            if code is None or name in done:
                continue
            task.reader.join(timeout=2.0)  # its last lines (and any fault match) first
            if code == 0:
                done.add(name)
                continue
            if code == STOPPED_STATUS:  # a planned stop after a backup; the others follow
                done.add(name)
                stopped.add(name)
                continue
            if job.stop_requested.is_set():
                break
            failure = (name, code, f"{name} {_describe_exit(code)}")
            break
        if job.stop_requested.is_set():
            continue

        now = time.monotonic()
        if failure is None and timeout is not None and now - attempt_start > timeout:
            failure = (lead, 124, f"attempt {attempt} ran longer than timeout={timeout:g}s")
        if failure is None and hang_timeout is not None and now - job.activity > hang_timeout:
            failure = (lead, 124, f"no task printed anything for hang_timeout={hang_timeout:g}s (hung)")

        if failure is None:
            if trainers <= done:
                # An evaluator gets ``grace`` seconds to finish its last evaluation by itself;
                # servers (ps, and workers of a ps job) never end on their own.
                deadline = time.monotonic() + grace
                while (time.monotonic() < deadline and job.tasks.get("evaluator:0") is not None
                       and job.tasks["evaluator:0"].poll() is None and not received):
                    time.sleep(0.05)
                leftovers = [t for n, t in job.tasks.items() if n not in done and t.poll() is None]
                if leftovers:
                    job.stop_all(signal.SIGTERM, grace)
                if stopped:
                    job.event(f"the job stopped as planned ({', '.join(sorted(stopped))} exited with "
                              f"status {STOPPED_STATUS})")
                return 0, restarts, None, bool(stopped)
            continue

        name, code, description = failure
        tail = "\n".join(f"  [{name}] {line}" for line in job.tasks[name].tail) if name in job.tasks else ""
        role = name.split(":")[0]
        partial = mode is JobMode.PARAMETER_SERVER and role == Role.WORKER.value and code != 124
        if restarts >= max_restarts:
            job.event(f"{description}; restart limit reached ({restarts} of max_restarts={max_restarts})")
            job.stop_all(signal.SIGTERM, grace)
            status = _exit_status(code)
            message = (f"The job failed: {description}; restart limit reached "
                       f"({restarts} of max_restarts={max_restarts}). Last output of {name}:\n{tail}")
            return status or 1, restarts, message, False
        restarts += 1
        delay = restart_delay()
        if partial:
            job.event(f"{description}; restarting {name} only (restart {restarts}/{max_restarts}) "
                      f"in {delay:g}s")
            job.tasks[name].reap(0.0)
            time.sleep(delay)
            r, i = name.split(":")
            job.start_task(r, int(i), restarts)
            job.event(f"restarted {name} (attempt {restarts})")
            continue
        job.event(f"{description}; restarting all {spec.num_tasks()} tasks "
                  f"(restart {restarts}/{max_restarts}) in {delay:g}s")
        job.stop_all(signal.SIGKILL, 0.0)
        job.tasks.clear()
        done.clear()
        stopped.clear()
        time.sleep(delay)
        attempt = restarts
        job.start_all(attempt)
        job.event(f"restarted the job (attempt {attempt})")
        attempt_start = time.monotonic()
        job.activity = time.monotonic()


# --------------------------------------------------------------------------- ps/worker server


def serve(tf_config: str | Mapping[str, Any] | None = None) -> None:
    """Runs this process's task of a parameter-server cluster as a ``tf.distribute.Server``.

    The server gets :func:`tensorfleet.strategies.data_parallel.worker_server_config` (at
    least ``workers + 1`` inter-op threads: with fewer, a 2-core machine deadlocks in the
    first epoch). Blocks until the process is stopped.

    Example (reads TF_CONFIG; what the launcher runs for ps and worker tasks):
        >>> serve()  # doctest: +SKIP
    """
    from tensorfleet.strategies.data_parallel import start_server

    raw = tf_config if tf_config is not None else os.environ.get("TF_CONFIG", "")
    config = parse_tf_config(raw)
    if config.task is None:
        raise TFConfigError("TF_CONFIG has no 'task'; the server needs to know which task it is.")
    server = start_server(config.cluster, config.task.role, config.task.index)
    print(f"tensorfleet: {config.task} serving at {config.task.address}", flush=True)
    server.join()


if __name__ == "__main__":  # pragma: no cover - the process the launcher starts for ps/workers
    if sys.argv[1:] == ["--serve"]:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        serve()
    else:
        sys.exit("usage: python -m tensorfleet.cluster.launcher --serve  (reads TF_CONFIG)")
