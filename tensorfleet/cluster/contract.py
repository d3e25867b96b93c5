"""The contract between the launcher and the tasks it starts: environment, lines, exit statuses.

The launcher (and a Kubernetes TFJob) tells every task who it is through environment
variables; a migratable job's task gets its options as one JSON record
(:class:`~tensorfleet.cluster.migration.TaskOptions`, written by ``to_env`` and read by
``from_env``) and, when it shares devices, how many steps it may have done in a gate file
(:func:`write_gate`, :func:`read_gate`); a task tells the launcher what it did in lines that
begin with :data:`PREFIX` (each kind a :class:`Mark`: its wording once, with the function that
writes it and the one that reads it back) and how it ended through its exit status. Both ends
use the names here, so they cannot drift apart.

Example:
    >>> describe_exit(STOPPED_STATUS), describe_exit(-9)
    ('exited with status 75', 'was killed by SIGKILL')
    >>> shell_status(-15)
    143
    >>> STEP_DONE.text(step=3, at=12.5)
    'tensorfleet: step 3 done at 12.500'
    >>> STEP_DONE.read("[worker:0] tensorfleet: step 3 done at 12.500")
    {'step': 3, 'at': 12.5}
    >>> SAVING.pattern(step=5)
    '^tensorfleet: saving step 5$'
"""

from __future__ import annotations

import os
import re
import signal
import string
import sys
from pathlib import Path
from typing import Any, Mapping

from tensorfleet.validation import integer

__all__ = [
    "ENV_ATTEMPT", "ENV_BACKUP_DIR", "ENV_BATCH_POLICY", "ENV_MIGRATION", "ENV_NUM_WORKERS", "ENV_SCALE_LR",
    "ENV_STOP_AFTER_EPOCH", "ENV_TASK", "ENV_TRAINING_ENDED", "HUNG_STATUS", "SERVE_ARGS", "STOPPED_STATUS",
    "StopRequest", "check_mesh_tasks", "check_task_counts", "describe_exit", "shell_status",
    "PREFIX", "Mark", "attempt", "read_gate", "write_gate", *(  # the lines tasks write, below
        "BATCHES", "EPOCH_BEGIN", "EPOCH_END", "EPOCH_ENDED_AT_STEP", "EPOCH_STEP", "FINISHED", "FIRST_STEP_DONE",
        "RESUMED", "RESUMED_FROM_BACKUP", "SAVED", "SAVING", "SERVING", "STEP_DONE", "STOPPING",
        "STOPPING_AFTER_EPOCH"),
]

#: ``role:index`` of the task, e.g. ``worker:1``.
ENV_TASK = "TENSORFLEET_TASK"
#: The attempt (0 for the first run, then the restart number) the process belongs to.
ENV_ATTEMPT = "TENSORFLEET_ATTEMPT"
#: The number of worker tasks of the job.
ENV_NUM_WORKERS = "TENSORFLEET_NUM_WORKERS"
#: The backup directory every worker of the job shares.
ENV_BACKUP_DIR = "TENSORFLEET_BACKUP_DIR"
#: Set by an elastic phase: stop right after this epoch's backup, with :data:`STOPPED_STATUS`.
ENV_STOP_AFTER_EPOCH = "TENSORFLEET_STOP_AFTER_EPOCH"
#: The elastic batch-size policy (``keep_global`` or ``keep_per_replica``).
ENV_BATCH_POLICY = "TENSORFLEET_BATCH_POLICY"
#: The learning rate for the global batch, ``RULE:REFERENCE_BATCH`` (``launch --scale-lr``): applied by
#: :func:`tensorfleet.cluster.fault_tolerance.callbacks` at each start, so a restart at another size gets its rate.
ENV_SCALE_LR = "TENSORFLEET_SCALE_LR"
#: The options of a migratable job's trainer task (JSON; see :mod:`tensorfleet.cluster.migration`).
ENV_MIGRATION = "TENSORFLEET_MIGRATION"
#: A file the launcher creates once every trainer has finished: an evaluator that sees it evaluates
#: the newest checkpoint (if it has not yet) and exits by itself.
ENV_TRAINING_ENDED = "TENSORFLEET_TRAINING_ENDED"

#: Exit status of a task that stopped on purpose after a backup (``EX_TEMPFAIL``: resume later).
STOPPED_STATUS = 75
#: Status of an attempt that ran too long or went silent (as ``timeout(1)`` reports it).
HUNG_STATUS = 124

#: The interpreter arguments that run a parameter-server job's worker or ps task (a
#: ``tf.distribute.Server``; see :func:`tensorfleet.cluster.server.serve`). ``-P`` (Python 3.11)
#: keeps the working directory off ``sys.path``, so a file there named like a standard-library
#: module (``bisect.py``) cannot shadow the library. User scripts keep their own directory on
#: ``sys.path``, as Python gives it to every script.
SERVE_ARGS = ("-P", "-m", "tensorfleet.cluster.launcher", "--serve")


def describe_exit(code: int) -> str:
    """How a process ended, from its ``Popen.returncode`` (negative: killed by that signal)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


def shell_status(code: int) -> int:
    """A shell-style status: 128 + signal number for a process killed by a signal."""
    return 128 + (-code) if code < 0 else code


def check_task_counts(workers: int, ps: int, chief: bool, *, job: str = "A job") -> bool:
    """Checks the task counts every job (local or a TFJob) must have; returns whether it has a chief.

    A parameter-server job always gets a chief: ``ParameterServerStrategy``'s coordinator runs there.

    Example:
        >>> check_task_counts(2, 1, False)
        True
        >>> check_task_counts(0, 0, False, job="A TFJob")
        Traceback (most recent call last):
        ValueError: A TFJob needs at least one worker (or a chief). Received: workers=0
    """
    integer("workers", workers, minimum=0)
    integer("ps", ps, minimum=0)
    if workers == 0 and not chief:
        raise ValueError(f"{job} needs at least one worker (or a chief). Received: workers=0")
    if ps and not workers:
        raise ValueError(f"A parameter-server job needs at least one worker. Received: workers=0, ps={ps}")
    return bool(chief or ps)


def check_mesh_tasks(others: Mapping[str, int], env: Mapping[str, str] | None) -> None:
    """A mesh across processes (``launch(mesh=True)``, ``--mesh``, a TFJob's ``mesh=True``) has workers only, each
    a DTensor client, and DTensor's environment comes from each task's TF_CONFIG, not from ``env``.

    Example:
        >>> check_mesh_tasks({"ps": 1}, None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: A mesh across processes (mesh=True, --mesh) runs workers only, ...; drop the ps. Received: ps=1
    """
    given = {role: int(count) for role, count in others.items() if count}
    if given:
        raise ValueError(f"A mesh across processes (mesh=True, --mesh) runs workers only, each a process of the "
                         f"mesh; drop the {', '.join(given)}. Received: "
                         f"{', '.join(f'{role}={count}' for role, count in given.items())}")
    given_env = sorted(k for k in (env or {}) if k.startswith("DTENSOR_"))
    if given_env:
        raise ValueError(f"env must not set DTensor's variables with mesh=True: each task's own come from its "
                         f"TF_CONFIG. Received: {', '.join(given_env)}")


class StopRequest:
    """SIGTERM (what Kubernetes and ``kill`` send) or SIGINT, noted when it comes and acted on at the
    next step boundary: the step in progress finishes, the checkpoint is written, the task exits
    with :data:`STOPPED_STATUS`."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def install(self) -> None:
        """Takes SIGTERM and SIGINT from here on (again after TensorFlow installed handlers of its own)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._note)

    def _note(self, signum: int, _frame: Any) -> None:
        if self.signal is None:
            self.signal = signum

    @property
    def requested(self) -> bool:
        return self.signal is not None


def attempt(environ: Mapping[str, str] | None = None) -> int:
    """The attempt this task belongs to (:data:`ENV_ATTEMPT`; 0 outside the launcher or on its first run)."""
    value = (os.environ if environ is None else environ).get(ENV_ATTEMPT, "0").strip() or "0"
    if not value.isdigit():
        raise ValueError(f"{ENV_ATTEMPT} must be an integer >= 0. Received: {value!r}")
    return int(value)


# --------------------------------------------------------------------------- the gate of shared devices


def write_gate(path: str | os.PathLike[str], steps: int) -> None:
    """Allows the job whose gate is ``path`` to have done ``steps`` steps of this run (the multiplexer's end)."""
    from tensorfleet.io import write_text

    write_text(path, str(steps))


def read_gate(path: str | os.PathLike[str]) -> int:
    """How many steps of this run the gate at ``path`` allows (0 while it is missing or being replaced)."""
    try:
        return int(Path(path).read_text() or 0)
    except (OSError, ValueError):
        return 0


# --------------------------------------------------------------------------- the lines tasks write

#: Every line a task writes for the launcher (and for people) begins with this.
PREFIX = "tensorfleet:"

_FIELD_PATTERNS = {"d": (r"-?\d+", int), "f": (r"-?\d+(?:\.\d+)?", float), "": (r".*?", str)}
_TASK = r"(?:\[[^\]]+\] )?"  # the launcher's "[worker:0] " before a task's line, when there is one


def _escape(text: str) -> str:
    return re.escape(text).replace("\\ ", " ")  # spaces need none: patterns stay readable


class Mark:
    """One kind of line a task writes: its wording, once, as a :meth:`str.format` template of named fields
    (``{step:d}`` an integer, ``{at:.3f}`` a number, ``{reason}`` any text), and the functions that write
    (:meth:`say`, :meth:`text`) and read (:meth:`read`, :meth:`pattern`) it."""

    def __init__(self, template: str) -> None:
        self.template = template
        self._parts: list[tuple[str, str | None, str]] = []  # (literal text, field, its pattern)
        self._fields: dict[str, Any] = {}
        for literal, name, spec, _ in string.Formatter().parse(template):
            kind = spec[-1:] if spec and spec[-1:] in ("d", "f") else ""
            regex, convert = _FIELD_PATTERNS[kind]
            self._parts.append((literal, name, regex))
            if name is not None:
                self._fields[name] = convert
        self._regex = re.compile(rf"^{_TASK}{self._body({})}$")

    def __repr__(self) -> str:
        return f"Mark({self.template!r})"

    def _body(self, fixed: Mapping[str, Any]) -> str:
        pieces = [_escape(PREFIX), " "]
        for literal, name, regex in self._parts:
            pieces.append(_escape(literal))
            if name is not None:
                pieces.append(_escape(str(fixed[name])) if name in fixed else f"(?P<{name}>{regex})")
        return "".join(pieces)

    def text(self, **values: Any) -> str:
        """The line: ``PREFIX`` and the template filled in with ``values``."""
        return f"{PREFIX} {self.template.format(**values)}"

    def say(self, *, stream: Any = None, **values: Any) -> None:
        """Writes the line to ``stream`` (standard output by default) at once: the task's end of the contract."""
        print(self.text(**values), file=stream or sys.stdout, flush=True)

    def read(self, line: str) -> dict[str, Any] | None:
        """The values of ``line`` (a task's line, with or without the launcher's ``[task] ``), or ``None``
        when it is not this kind of line: the launcher's end of the contract."""
        found = self._regex.match(line)
        if found is None:
            return None
        return {name: convert(found.group(name)) for name, convert in self._fields.items()}

    def pattern(self, **fixed: Any) -> str:
        """A regular expression for a task's line of this kind (for ``Fault``, ``stop_when`` and
        ``LaunchResult.first_time``), the fields in ``fixed`` set to those values, the others any."""
        unknown = sorted(set(fixed) - set(self._fields))
        if unknown:
            raise ValueError(f"{self!r} has no field(s) {unknown}. Its fields: {list(self._fields)}")
        return f"^{self._body(fixed)}$"


# A migratable job's trainer (tensorfleet.cluster.resumable, ps_balance, mesh_job):
#: After each step of a job whose steps are gated (shared devices): the multiplexer counts these.
STEP_DONE = Mark("step {step:d} done at {at:.3f}")
#: After the first step (its time includes tracing).
FIRST_STEP_DONE = Mark("first step done at {at:.3f}")
#: Where a continued job picked up.
RESUMED = Mark("resumed at step {step:d} (epoch {epoch:d}, example {position:d} of {examples:d}) from {strategy} "
               "over {replicas:d} replica(s); optimizer step {iterations:d}")
#: Before and after the chief writes a checkpoint.
SAVING = Mark("saving step {step:d}")
SAVED = Mark("saved step {step:d}")
#: At the end of each epoch (``details``: the accuracy and a parameter server's examples per worker, if any).
EPOCH_ENDED_AT_STEP = Mark("epoch {epoch:d}/{epochs:d} end at step {step:d} at {at:.3f}{details}")
#: At a planned stop or a stop signal, after the checkpoint.
STOPPING = Mark("stopping at step {step:d} {reason} at {at:.3f}")
#: When the job has run all its epochs.
FINISHED = Mark("finished at step {step:d} at {at:.3f}")
#: When the per-replica (``who``: replica) or per-worker (worker) batches change with the measured speeds.
BATCHES = Mark("{who} batches {sizes} at step {step:d} (examples/s measured: {speeds})")
#: A parameter-server job's worker or ps task, once its server is up.
SERVING = Mark("{task} serving at {address}")

# A Keras fit job's callbacks (tensorfleet.cluster.fault_tolerance):
#: The first epoch of a run that restored a backup.
RESUMED_FROM_BACKUP = Mark("resumed from backup at epoch {epoch:d}")
EPOCH_BEGIN = Mark("epoch {epoch:d}/{epochs:d} begin")
#: ``metrics``: `` name=value`` for each logged metric, or nothing.
EPOCH_END = Mark("epoch {epoch:d}/{epochs:d} end{metrics}")
EPOCH_STEP = Mark("epoch {epoch:d} step {step:d}")
STOPPING_AFTER_EPOCH = Mark("stopping after epoch {epoch:d} as planned")
