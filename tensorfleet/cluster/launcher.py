"""Local multi-process launcher: one process per task of a tf.distribute cluster.

TensorFlow ships no launcher (PyTorch has ``torchrun``, Horovod ``horovodrun``). :func:`launch`
starts one process per task on 127.0.0.1 with free ports and each task's TF_CONFIG (from
:class:`~tensorfleet.strategies.tf_config.ClusterSpec`), prefixes every output line with the
task (``[worker:1] ...``), forwards SIGINT/SIGTERM to every task's process group, and ends
with the chief's exit status (worker 0's when there is no chief) or the first failure's.

Its options beyond the cluster's shape come in four small groups (:mod:`~tensorfleet.cluster.launch_options`):
:class:`Recovery`, :class:`Timeouts`, :class:`TaskOutput` and :class:`TaskCommand`.

When a task dies the job is restarted, up to ``Recovery.max_restarts`` times with exponential backoff
(:mod:`~tensorfleet.cluster.supervisor` is the state machine that decides):

* multi-worker mirrored (collective) jobs restart every task, because the collective group
  must be rebuilt with all members;
* parameter-server jobs restart only a failed worker, which TensorFlow's
  ``ClusterCoordinator`` tolerates (its closures are re-run on the other workers until the
  worker is back); a failed chief or ps restarts the job.

A collective that hangs because a peer is gone is ended by the launcher noticing the dead
peer (it stops the survivors at once instead of letting them wait), by the script's own
``CommunicationOptions(timeout_seconds=...)``, or, for tasks that neither exit nor print,
by ``Timeouts.hang_timeout``: no output from any task for that long counts as a failure.

SIGTERM alone does not end a multi-worker TensorFlow task: TensorFlow's preemption notifier
catches it (the coordination service treats it as a preemption notice), so after forwarding
SIGINT or SIGTERM the launcher waits ``Timeouts.grace`` seconds and then SIGKILLs what is left.

In a parameter-server job only the chief runs the script; workers and ps run tensorfleet's
server (``python -P -m tensorfleet.cluster.launcher --serve``, :func:`~tensorfleet.cluster.server.serve`),
which sets ``inter_op_parallelism_threads`` to ``workers + 1`` (without it a 2-core machine hangs
in the first epoch). The processes are :mod:`~tensorfleet.cluster.processes`, the record
they leave is :mod:`~tensorfleet.cluster.result`, and what the tasks are told and tell back
(environment, exit statuses) is :mod:`~tensorfleet.cluster.contract`.

Example:
    >>> from tensorfleet.cluster import launcher
    >>> result = launcher.launch("train.py", workers=2, recovery=launcher.Recovery(max_restarts=2))  # doctest: +SKIP
    >>> result.returncode, result.restarts  # doctest: +SKIP
    (0, 0)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Mapping, Sequence

from tensorfleet.cluster.contract import ENV_BACKUP_DIR, ENV_TRAINING_ENDED, check_mesh_tasks, check_task_counts
from tensorfleet.cluster.launch_options import Recovery, TaskCommand, TaskOutput, Timeouts, group
from tensorfleet.cluster.processes import JobMode, LocalJob
from tensorfleet.cluster.result import LaunchResult
from tensorfleet.cluster.supervisor import Supervisor, forwarded_signals
from tensorfleet.netbind import loopback_env
from tensorfleet.strategies.tf_config import ClusterSpec, Role, TFConfigError, parse_tf_config
from tensorfleet.validation import choice

__all__ = [
    "JobMode",
    "LaunchError",
    "LaunchFailedError",
    "LaunchResult",
    "PortInUseError",
    "Recovery",
    "TFConfigConflictError",
    "TaskCommand",
    "TaskOutput",
    "Timeouts",
    "launch",
]

_LOCALHOST = "127.0.0.1"


class LaunchError(RuntimeError):
    """A job could not be started or did not complete."""


class LaunchFailedError(LaunchError):
    """The job failed and the restart limit is reached; ``result`` holds the whole record."""

    def __init__(self, message: str, result: LaunchResult) -> None:
        super().__init__(message)
        self.result = result


class PortInUseError(LaunchError, ValueError):
    """A task's port is already taken on 127.0.0.1."""


class TFConfigConflictError(TFConfigError):
    """TF_CONFIG is already set in the environment and names another cluster."""


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
    recovery: Recovery = Recovery(),
    timeouts: Timeouts = Timeouts(),
    output: TaskOutput = TaskOutput(),
    command: TaskCommand = TaskCommand(),
    check: bool = True,
    mesh: bool = False,
) -> LaunchResult:
    """Runs ``script`` as a local tf.distribute cluster, one process per task.

    Args:
        script: the Python training script; every trainer task runs it with ``args``.
        args: command-line arguments for the script.
        workers: number of worker tasks (>= 1, or 0 with ``chief=True``).
        ps: number of parameter-server tasks; a ps job always gets a chief (the coordinator).
        chief: add a chief task.
        evaluator: add an evaluator task (see :func:`tensorfleet.cluster.evaluation.evaluation`).
            Once the trainers finish, it is told so (``TENSORFLEET_TRAINING_ENDED``) and the
            launcher waits for it to evaluate the last checkpoint and exit.
        ports: one port per task (chief, workers, ps, evaluator order); free ports by default.
        mode: ``"auto"`` (parameter server when ``ps > 0``, else collective), ``"collective"``
            or ``"parameter_server"``; decides what a restart restarts.
        recovery: restarts, their backoff and the backup directory (:class:`Recovery`).
        timeouts: of an attempt, of a silence, of the grace after SIGTERM and of the evaluator (:class:`Timeouts`).
        output: where the tasks' lines go, how they are shown and the line that stops the job (:class:`TaskOutput`).
        command: the tasks' interpreter, runner module and extra environment (:class:`TaskCommand`).
        check: raise :class:`LaunchFailedError` when the job fails for good.
        mesh: the workers are the processes of one DTensor mesh: a
            :class:`~tensorfleet.model_parallel.mesh.Mesh` made in the script spans the devices of
            every worker (each its share), DTensor's environment set from each task's TF_CONFIG
            (:mod:`tensorfleet.model_parallel.mesh.clients`). Workers only: no ps, chief or evaluator.

    Returns:
        A :class:`LaunchResult`: exit status (the chief's, or the first failure's), restarts,
        every output line with its task and time, and the launcher's events.

    Raises:
        FileNotFoundError: the script does not exist.
        ValueError: zero workers, a negative count, or a bad option (each group checks its own when made).
        TypeError: a group that is not its option class.
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
    if mesh:
        check_mesh_tasks({"ps": ps, "chief": chief, "evaluator": evaluator}, getattr(command, "env", None))
    chief = check_task_counts(workers, ps, chief)  # a ps job gets a chief: the coordinator runs there
    recovery, timeouts = group("recovery", recovery, Recovery), group("timeouts", timeouts, Timeouts)
    output, command = group("output", output, TaskOutput), group("command", command, TaskCommand)
    spec = ClusterSpec.local(workers=workers, ps=ps, chief=chief, evaluator=evaluator, host=_LOCALHOST,
                             ports=list(ports) if ports is not None else None)
    job_mode = _resolve_mode(mode, spec)
    if ports is not None:
        _check_ports_free(spec)
    task_env = _task_env(spec, command.env, recovery.backup_dir)
    if mesh:
        from tensorfleet.model_parallel.mesh.clients import ENV_ACROSS

        task_env[ENV_ACROSS] = "1"
        for name in [k for k in task_env if k.startswith("DTENSOR_")]:  # the tasks' own, from their TF_CONFIG
            del task_env[name]
    scratch = tempfile.mkdtemp(prefix="tensorfleet-launch-") if evaluator else None
    if scratch is not None:
        task_env[ENV_TRAINING_ENDED] = os.path.join(scratch, "training-ended")
    job = LocalJob(spec=spec, mode=job_mode, argv=command.argv(str(script_path), args), env=task_env,
                   log=output.log, stop_when=output.stop_when, verbose=output.verbose,
                   progress_interval=output.progress_interval)
    with forwarded_signals(job) as received:
        try:
            outcome = Supervisor(job, max_restarts=recovery.max_restarts, backoff=recovery.backoff,
                                 max_backoff=recovery.max_backoff, timeout=timeouts.timeout,
                                 hang_timeout=timeouts.hang_timeout, grace=timeouts.grace, received=received,
                                 evaluator_timeout=timeouts.evaluator_timeout).run()
        finally:
            job.stop_all(signal.SIGKILL, 0.0)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
    result = LaunchResult(returncode=outcome.returncode, restarts=outcome.restarts, cluster=spec,
                          lines=list(job.lines), events=list(job.events), duration=job.now(),
                          stopped=outcome.stopped, error=outcome.error, spans=job.spans())
    if check and result.returncode != 0:
        raise LaunchFailedError(result.error or f"The job failed with status {result.returncode}.", result)
    return result


# --------------------------------------------------------------------------- argument checks


def _check_script(script: str | os.PathLike[str]) -> Path:
    path = Path(script)
    if not path.exists():
        raise FileNotFoundError(f"The script to launch does not exist. Received: script={str(script)!r}")
    if not path.is_file():
        raise FileNotFoundError(f"The script to launch is not a file. Received: script={str(script)!r}")
    source = path.read_bytes()
    if not source.strip():
        raise ValueError(f"The script to launch is empty. Received: script={str(script)!r}")
    try:  # compiled, not run: a file that is not Python fails here, not in every task
        compile(source, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        line = getattr(error, "lineno", None)  # a SyntaxError's; a ValueError (a NUL byte) has none
        where = f" (line {line})" if line else ""
        raise ValueError(f"The script to launch is not Python: {getattr(error, 'msg', error)}{where}. Received: "
                         f"script={str(script)!r}") from None
    return path.resolve()


def _resolve_mode(mode: JobMode | str, spec: ClusterSpec) -> JobMode:
    resolved = choice(JobMode, "mode", mode)
    if resolved is JobMode.AUTO:
        return JobMode.PARAMETER_SERVER if spec.num_tasks(Role.PS.value) else JobMode.COLLECTIVE
    if resolved is JobMode.PARAMETER_SERVER and not spec.num_tasks(Role.PS.value):
        raise ValueError("mode='parameter_server' needs at least one ps task. Received: ps=0")
    return resolved


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


def _task_env(spec: ClusterSpec, env: Mapping[str, str] | None,
              backup_dir: str | os.PathLike[str] | None) -> dict[str, str]:
    """The environment every task starts from: this process's, ``env``, the loopback binding."""
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
                      "every interface, not only 127.0.0.1. Install a C compiler (cc).", RuntimeWarning, stacklevel=3)
    parent_env.update(bind_env)
    if backup_dir is not None:
        parent_env[ENV_BACKUP_DIR] = str(Path(backup_dir).resolve())
    return parent_env


if __name__ == "__main__":  # pragma: no cover - the process the launcher (and a TFJob) starts for ps/workers
    if sys.argv[1:] == ["--serve"]:
        from tensorfleet.cluster.server import serve

        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        serve()
    else:
        sys.exit("usage: python -P -m tensorfleet.cluster.launcher --serve  (reads TF_CONFIG)")
