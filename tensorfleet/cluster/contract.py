"""The contract between the launcher and the tasks it starts: environment and exit statuses.

The launcher (and a Kubernetes TFJob) tells every task who it is through environment
variables; a task tells the launcher how it ended through its exit status. Both ends read the
names here, so they cannot drift apart.

Example:
    >>> describe_exit(STOPPED_STATUS), describe_exit(-9)
    ('exited with status 75', 'was killed by SIGKILL')
    >>> shell_status(-15)
    143
"""

from __future__ import annotations

import signal
from typing import Any

from tensorfleet.validation import integer

__all__ = [
    "ENV_ATTEMPT", "ENV_BACKUP_DIR", "ENV_BATCH_POLICY", "ENV_MIGRATION", "ENV_NUM_WORKERS", "ENV_STOP_AFTER_EPOCH", "ENV_TASK",
    "ENV_TRAINING_ENDED", "HUNG_STATUS", "SERVE_ARGS", "STOPPED_STATUS", "StopRequest", "check_task_counts", "describe_exit", "shell_status",
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
