"""The groups of :func:`~tensorfleet.cluster.launcher.launch`'s options, each a small frozen dataclass.

The common call stays short (``launch("train.py", workers=2)``); what belongs together is passed
together and checked when it is made, one clear error for a bad value:

* :class:`Recovery`: what happens when a task dies (restarts, their backoff, the backup directory
  the tasks resume from);
* :class:`Timeouts`: how long an attempt, a silence, a stop and the evaluator may take;
* :class:`TaskOutput`: where the tasks' lines go, how they are shown, and the line that stops the job;
* :class:`TaskCommand`: how each task's process is started (interpreter, runner, environment).

Example:
    >>> from tensorfleet.cluster.launcher import launch
    >>> launch("train.py", workers=2, recovery=Recovery(max_restarts=2, backup_dir="backup"),
    ...        timeouts=Timeouts(hang_timeout=60), output=TaskOutput(log=None))  # doctest: +SKIP
    >>> Recovery(max_restarts=-1)
    Traceback (most recent call last):
    ValueError: max_restarts must be an integer >= 0. Received: max_restarts=-1
"""

from __future__ import annotations

import operator
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from tensorfleet.io import check_out_dir
from tensorfleet.validation import integer, number, renamed_fields

__all__ = ["Recovery", "TaskCommand", "TaskOutput", "Timeouts"]


def print_line(text: str) -> None:
    """The default :attr:`TaskOutput.log`: each line to this process's standard output, at once."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


@dataclass(frozen=True)
class Recovery:
    """What happens when a task dies.

    Args:
        max_restarts: how many times a failed job (or parameter-server worker) is restarted.
        backoff: seconds before the first restart, doubled for each further one.
        max_backoff: cap of the backoff.
        backup_dir: exported to the tasks as ``TENSORFLEET_BACKUP_DIR`` for
            :func:`tensorfleet.cluster.fault_tolerance.callbacks` (where a restarted job resumes from).
    """

    max_restarts: int = 0
    backoff: float = 1.0
    max_backoff: float = 30.0
    backup_dir: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        integer("max_restarts", self.max_restarts, minimum=0)
        number("backoff", self.backoff, minimum=0)
        number("max_backoff", self.max_backoff, minimum=0)
        check_out_dir("backup_dir", self.backup_dir, probe="backup")  # before any task starts, not in epoch 1


@dataclass(frozen=True)
class Timeouts:
    """How long things may take, in seconds.

    Args:
        timeout: one attempt, before it counts as failed (hung); ``None``: no limit.
        hang_timeout: without output from any task, before the attempt counts as hung; ``None``: no limit.
        grace: what tasks get after SIGTERM/SIGINT before SIGKILL.
        evaluator_timeout: what the evaluator may take, once training has ended, to finish its evaluations
            by itself; then it is stopped (an event says so).
    """

    timeout: float | None = None
    hang_timeout: float | None = None
    grace: float = 5.0
    evaluator_timeout: float = 300.0

    def __post_init__(self) -> None:
        number("timeout", self.timeout, above=0, optional=True)  # None, not 0, is no limit
        number("hang_timeout", self.hang_timeout, above=0, optional=True)
        number("grace", self.grace, minimum=0)
        number("evaluator_timeout", self.evaluator_timeout, minimum=0)


@renamed_fields(sink="log", quiet=("verbose", operator.not_))
@dataclass(frozen=True)
class TaskOutput:
    """Where the tasks' output lines go and how they are shown.

    Args:
        log: receives every prefixed output line (``[worker:1] ...``) and launcher event; ``None``
            keeps them only in the result. Default: this process's standard output.
        verbose: also show TensorFlow's known start-up noise (:data:`tensorfleet.cluster.console.NOISE`);
            by default it is left out of what ``log`` gets and of the log tail of an error. The result
            keeps every line either way.
        progress_interval: a progress bar a task redraws with ``\\r`` (Keras' ``fit``) reaches ``log`` as
            one line of its state at most this often (seconds), and its final state.
        stop_when: a regular expression; the first line of the chief's output (worker 0's without a
            chief) matching it stops the job on purpose (SIGTERM to all tasks); the result then has
            ``stopped=True``. Only the chief's lines count because the chief writes the backups: a
            line it prints after a backup means the backup is complete.
    """

    log: Callable[[str], None] | None = print_line
    verbose: bool = False
    progress_interval: float = 2.0
    stop_when: str | None = None

    def __post_init__(self) -> None:
        if self.log is not None and not callable(self.log):
            raise TypeError(f"log must be a function of one line (str), or None. Received: log={self.log!r}")
        number("progress_interval", self.progress_interval, minimum=0)
        if self.stop_when is not None:
            try:
                re.compile(self.stop_when)
            except (re.error, TypeError) as exc:
                raise ValueError(f"stop_when must be a regular expression ({exc}). "
                                 f"Received: stop_when={self.stop_when!r}") from None


@dataclass(frozen=True)
class TaskCommand:
    """How each task's process is started: ``python [*runner] SCRIPT [*args]`` in this environment plus ``env``.

    Args:
        env: extra environment variables for every task (TF_CONFIG is set by the launcher).
        python: the interpreter (default: this one).
        runner: interpreter arguments before the script, such as ``("-m", "tensorfleet.profiling.autorun")``,
            a module that runs the script as ``python SCRIPT`` would, with something added
            (``tensorfleet launch --profile-steps`` uses that one).
    """

    env: Mapping[str, str] | None = None
    python: str | None = None
    runner: Sequence[str] = ()

    def __post_init__(self) -> None:
        if isinstance(self.runner, str) or not all(isinstance(a, str) for a in self.runner):
            raise ValueError("runner must be a sequence of strings, such as ('-m', 'tensorfleet.profiling.autorun'). "
                             f"Received: runner={self.runner!r}")
        object.__setattr__(self, "runner", tuple(self.runner))
        if self.env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in
                                            _items(self.env)):
            raise ValueError(f"env must map names to strings. Received: env={self.env!r}")

    def argv(self, script: str, args: Sequence[Any]) -> list[str]:
        """The command line of a task running ``script`` with ``args``."""
        return [self.python or sys.executable, *self.runner, script, *map(str, args)]


def _items(env: Any) -> list[tuple[Any, Any]]:
    if not isinstance(env, Mapping):
        raise ValueError(f"env must map names to strings. Received: env={env!r}")
    return list(env.items())


def group(name: str, value: Any, kind: type) -> Any:
    """``value`` if it is a ``kind`` (one of the groups above); else one clear error naming it."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, such as {name}={kind.__name__}(). "
                        f"Received: {name}={value!r}")
    return value
