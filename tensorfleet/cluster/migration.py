"""Job migration: a Keras job stops at a step boundary and continues under another world size
or another strategy, from one checkpoint.

TensorFlow fixes a job's world size when its strategy is built (elasticity is "not an out of
the box feature", tensorflow/tensorflow#41589), so a job moves by stopping and starting again.
What makes that a migration rather than a restart is the checkpoint
(:mod:`~tensorfleet.cluster.jobstate`): weights, optimizer slots and step count, the step, the
epoch, the position in the epoch's order of examples and the random state of that order. The
task program (:mod:`~tensorfleet.cluster.resumable`) reads it under any of:

* ``mirrored`` over ``devices`` local devices (one process);
* ``multi_worker_mirrored`` over ``workers`` processes;
* ``parameter_server`` with ``workers`` workers and ``ps`` parameter servers (and a chief);
* ``mesh``: the data-parallel layout of :class:`~tensorfleet.model_parallel.mesh.Mesh` over ``devices``
  local devices (a 1-D mesh ``"b:N"`` with the rule ``"batch:b"``, dtensor backend), the model
  built and compiled in ``mesh.scope()`` and each step run by the mesh's own training function.

A job stops at a step boundary when told to (``stop_at_step``) or when a task receives SIGTERM
(what Kubernetes and ``kill`` send) or SIGINT: the step in progress finishes, the checkpoint is
written (atomically, the previous one kept) and the task exits with status 75
(:data:`~tensorfleet.cluster.contract.STOPPED_STATUS`, "stopped to move"; the launcher, when it was
itself signalled, then exits 75 too). Under multi-worker mirrored the stop is agreed: every step's
all-reduce carries each worker's stop request, and all workers stop after the first step in which
any had one, so they all stop at the same step. The servers of a parameter-server job outlive the
signal until the chief has saved.

The global batch follows the policy of :mod:`~tensorfleet.cluster.elastic`: ``keep_global``
(the same global batch at every size) or ``keep_per_replica``. Positions count examples, so
every example of an epoch is read once whatever sizes the epoch was trained at. At the same
size and strategy, a continued job is bit-identical to one never stopped (op determinism is on).

Everything that can be checked is checked before a process starts, and the checkpoint is only
read: a checkpoint of another model, a world size the batch policy cannot divide, a strategy or
placement that cannot hold the model.

Example:
    >>> from tensorfleet.cluster.migration import Placement
    >>> Placement("multi_worker_mirrored", workers=2).replicas
    2
    >>> result = migrate("job.py", "ckpt/", to=Placement("parameter_server", workers=2, ps=1),
    ...                  epochs=3, global_batch_size=64)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import operator
import os
from dataclasses import dataclass, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tensorfleet.cluster.contract import ENV_MIGRATION
from tensorfleet.cluster.elastic import BatchPolicy, batch_sizes
from tensorfleet.cluster.jobstate import CheckpointError, JobProgress, check_same_keras, fingerprint, read_state
from tensorfleet.cluster.processes import JobMode
from tensorfleet.cluster.result import LaunchResult
from tensorfleet.testing.hooks import active
from tensorfleet.validation import choice, integer, positive_int, renamed, renamed_fields

__all__ = ["MigrationError", "MigrationStrategy", "Placement", "RunOptions", "TaskOptions", "check_mesh_batches",
           "check_migration", "job_model", "migrate"]

_BYTES_PER_PARAMETER = 4 * 3  # float32 weights and Adam's two slots; other optimizers hold no more
#: Seconds a signalled task has to finish its step and write its checkpoint before the launcher SIGKILLs it.
_STOP_GRACE = 120.0


class MigrationError(ValueError):
    """A migration that cannot work, found before anything started."""


class MigrationStrategy(str, Enum):
    """The strategies a job can move between."""

    MIRRORED = "mirrored"
    MULTI_WORKER_MIRRORED = "multi_worker_mirrored"
    PARAMETER_SERVER = "parameter_server"
    MESH = "mesh"

    @property
    def in_one_process(self) -> bool:
        """Replicas over local devices of one process (``devices=N``), not over processes."""
        return self in (MigrationStrategy.MIRRORED, MigrationStrategy.MESH)


@dataclass(frozen=True)
class Placement:
    """Where a job runs: a strategy and its world size."""

    strategy: MigrationStrategy | str
    devices: int = 1
    workers: int = 1
    ps: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", choice(MigrationStrategy, "strategy", self.strategy))
        positive_int("devices", self.devices)
        positive_int("workers", self.workers)
        integer("ps", self.ps, minimum=0)
        kind = MigrationStrategy(self.strategy)  # the member __post_init__ set, typed
        if kind is MigrationStrategy.PARAMETER_SERVER and self.ps < 1:
            raise MigrationError(f"strategy='parameter_server' needs at least one ps task. Received: ps={self.ps}")
        if kind is not MigrationStrategy.PARAMETER_SERVER and self.ps:
            raise MigrationError(f"ps tasks belong to strategy='parameter_server'. Received: strategy="
                                 f"{kind.value!r}, ps={self.ps}")
        if kind.in_one_process and self.workers != 1:
            raise MigrationError(f"strategy={kind.value!r} runs in one process over local devices (devices=N). "
                                 f"Received: workers={self.workers}; use 'multi_worker_mirrored' for processes.")
        if not kind.in_one_process and self.devices != 1:
            raise MigrationError(f"devices=N is for strategy='mirrored' or 'mesh'. Received: strategy={kind.value!r}, "
                                 f"devices={self.devices}")

    @property
    def replicas(self) -> int:
        """Replicas that share one step (a parameter server's step runs on one worker)."""
        if MigrationStrategy(self.strategy).in_one_process:
            return self.devices
        return self.workers if self.strategy is MigrationStrategy.MULTI_WORKER_MIRRORED else 1

    def describe(self) -> str:
        kind = self.strategy
        if kind is MigrationStrategy.MIRRORED:
            return f"mirrored over {self.devices} device(s)"
        if kind is MigrationStrategy.MESH:
            return f"the mesh's data-parallel layout over {self.devices} device(s)"
        if kind is MigrationStrategy.MULTI_WORKER_MIRRORED:
            return f"multi_worker_mirrored over {self.workers} worker(s)"
        return f"parameter_server with {self.workers} worker(s) and {self.ps} ps"


@dataclass(frozen=True)
class RunOptions:
    """How far a job runs and how its batch is set (the same for every placement it moves to)."""

    epochs: int = 1
    global_batch_size: int = 32
    policy: BatchPolicy | str = BatchPolicy.KEEP_GLOBAL
    per_replica_batch_size: int | None = None
    seed: int = 0
    save_every: int = 0
    stop_at_step: int | None = None
    #: A file that holds how many steps the job may have done; set by :func:`tensorfleet.cluster.multiplex.share`.
    gate: str | None = None
    #: Per-replica batches in proportion to each replica's measured speed (:mod:`~tensorfleet.cluster.balance`).
    balance: bool = False
    #: ``RULE:REFERENCE_BATCH`` (``launch --scale-lr``): the job's learning rate scaled from the reference global
    #: batch to the one of each placement it runs on (:func:`tensorfleet.strategies.large_batch.scaled_lr`).
    scale_lr: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", choice(BatchPolicy, "policy", self.policy))
        positive_int("epochs", self.epochs)
        positive_int("global_batch_size", self.global_batch_size)
        integer("per_replica_batch_size", self.per_replica_batch_size, minimum=1, optional=True)
        integer("seed", self.seed, minimum=0)
        integer("save_every", self.save_every, minimum=0)
        integer("stop_at_step", self.stop_at_step, minimum=0, optional=True)
        if self.scale_lr is not None:
            from tensorfleet.strategies.large_batch import parse_scale_lr

            parse_scale_lr(self.scale_lr)

    @classmethod
    def from_progress(cls, progress: JobProgress, **changes: Any) -> RunOptions:
        """The options a checkpointed job ran with (epochs, batch, policy, seed), with ``changes``."""
        per_replica = progress.global_batch_size // progress.replicas
        base = cls(epochs=progress.epochs, global_batch_size=progress.global_batch_size, policy=progress.policy,
                   per_replica_batch_size=per_replica if progress.policy == BatchPolicy.KEEP_PER_REPLICA.value
                   else None, seed=progress.seed)
        return replace(base, **changes)


@renamed_fields(directory="out_dir")
@dataclass(frozen=True, kw_only=True)
class TaskOptions(RunOptions):
    """What a trainer task is told (:data:`~tensorfleet.cluster.contract.ENV_MIGRATION`): the run's options
    and where it runs. Written by :meth:`to_env` in :func:`migrate`, read by :meth:`from_env` in
    :mod:`~tensorfleet.cluster.resumable`: one declaration for both ends.

    The last three fields are :mod:`tensorfleet.testing`'s hooks (its ``equal_shares`` and ``slow_inputs``),
    which :meth:`of` takes from the hook point: no public signature carries them."""

    out_dir: str
    strategy: str
    devices: int = 1
    resume: bool = False
    #: Under a parameter server: steps in rounds of one per worker, each round joined, so that every worker
    #: reads an equal share of every epoch once and the slowest sets the pace (the equal static split of the
    #: input per worker, with an epoch that reads every example once; to compare with).
    equal_shares: bool = False
    #: Seconds each replica's input waits per example, times its ``slowdown`` factor (to benchmark heterogeneity).
    input_delay: float = 0.0
    slowdown: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "strategy", choice(MigrationStrategy, "strategy", self.strategy).value)
        positive_int("devices", self.devices)
        if self.slowdown is not None:  # a tuple, also when read back from JSON
            object.__setattr__(self, "slowdown", tuple(float(f) for f in self.slowdown))

    @classmethod
    @renamed(directory="out_dir")
    def of(cls, run: RunOptions, *, out_dir: str | os.PathLike[str], to: Placement, resume: bool) -> TaskOptions:
        """The options of ``run`` under ``to``, with its checkpoints in ``out_dir`` (and the testing hooks set now)."""
        shared = {f.name: getattr(run, f.name) for f in fields(RunOptions)}
        hooks = active()
        return cls(**shared, out_dir=str(Path(out_dir).resolve()), strategy=MigrationStrategy(to.strategy).value,
                   devices=to.devices, resume=resume, equal_shares=hooks.equal_shares,
                   input_delay=hooks.input_delay, slowdown=hooks.slowdown)

    def run(self) -> RunOptions:
        """The run's options alone."""
        return RunOptions(**{f.name: getattr(self, f.name) for f in fields(RunOptions)})

    def to_env(self) -> dict[str, str]:
        """The task's environment entry that carries these options (JSON)."""
        record = {f.name: getattr(self, f.name) for f in fields(self)}
        record.update(policy=BatchPolicy(self.policy).value, slowdown=list(self.slowdown) if self.slowdown else None)
        return {ENV_MIGRATION: json.dumps(record)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TaskOptions:
        """The options :meth:`to_env` wrote, read in the task."""
        environ = os.environ if environ is None else environ
        if ENV_MIGRATION not in environ:
            raise ValueError(f"A migratable job's task reads its options from ${ENV_MIGRATION}, which is not set: "
                             "start it with tensorfleet.cluster.migration.migrate or 'tensorfleet launch --strategy'.")
        record = json.loads(environ[ENV_MIGRATION])
        if "directory" in record and "out_dir" not in record:  # written by the previous release
            record["out_dir"] = record.pop("directory")
        return cls(**record)


@renamed(directory="out_dir")
def check_migration(out_dir: str | os.PathLike[str], *, to: Placement, run: RunOptions,
                    model: Any = None, resume: bool = True,
                    memory_bytes: float | None = None) -> JobProgress | None:
    """Everything :func:`migrate` checks before it starts a process; returns the checkpoint's state.

    Args:
        out_dir: the migration checkpoint directory.
        to: the placement to continue under.
        run: the run's options (the batch policy decides whether ``to`` can divide the batch).
        model: the job's model, to compare with the checkpoint's fingerprint (None: not compared).
        resume: whether ``out_dir`` must hold a checkpoint to continue from.
        memory_bytes: the memory one replica may use (default: this machine's memory divided by
            the replicas that share it), against the model's weights and optimizer slots.

    Raises:
        CheckpointError: nothing to resume, or a checkpoint of another model.
        MigrationError: a world size the batch policy cannot divide, or a placement that cannot
            hold the model.
    """
    if active().equal_shares and (run.balance or to.strategy is not MigrationStrategy.PARAMETER_SERVER):
        raise MigrationError(f"equal_shares (tensorfleet.testing) is a parameter server's way of splitting the epoch, "
                             f"without balance. Received: equal_shares=True, balance={run.balance}, "
                             f"to={to.describe()}.")
    if model is not None and to.strategy is MigrationStrategy.MESH:
        from tensorfleet.compat.keras import is_keras3_model

        if is_keras3_model(model):
            raise MigrationError(f"{to.describe()} runs Keras 2 (tf_keras) models only for now (the mesh builds its "
                                 f"layouts on tf_keras internals), and the job's build_model() returns a Keras 3 model "
                                 f"({type(model).__module__}.{type(model).__qualname__}). Move a Keras 3 job between "
                                 "mirrored, multi_worker_mirrored and parameter_server, or build it with tf_keras "
                                 "(`import tf_keras as keras`).")
    try:
        batch = batch_sizes(to.replicas, policy=run.policy, global_batch_size=run.global_batch_size,
                            per_replica_batch_size=run.per_replica_batch_size).global_batch_size
    except ValueError as exc:
        raise MigrationError(f"{to.describe()} cannot take the job's batch: {exc}") from None
    state = None
    if resume:
        state, _ = read_state(out_dir)
        check_mesh_batches(to, state.examples, batch)
        if model is not None:
            check_same_keras(state, model, out_dir)
        if model is not None and fingerprint(model) != state.fingerprint:
            raise CheckpointError(f"The checkpoint in {str(out_dir)!r} is of another model (its fingerprint "
                                  f"{state.fingerprint}, this job's model {fingerprint(model)}). Resume it with "
                                  "the job that wrote it, or start this one in another directory.")
    parameters = state.parameters if state is not None else _parameters(model)
    if parameters is not None:
        _check_memory(to, parameters, memory_bytes)
    return state


def check_mesh_batches(to: Placement, examples: int, batch: int) -> None:
    """The mesh splits every step's batch evenly over its devices, the epoch's last (shorter) one too."""
    last = examples % batch
    if to.strategy is MigrationStrategy.MESH and last % to.devices:
        raise MigrationError(f"{to.describe()} cannot take the job's batches: an epoch of {examples} examples ends "
                             f"with a batch of {last}, which its {to.devices} devices cannot split evenly. Received: "
                             f"global_batch_size={batch}, devices={to.devices}; pick a batch whose remainder they "
                             "divide, or mirrored.")


def _parameters(model: Any) -> int | None:
    if model is None:
        return None
    import numpy as np

    return int(sum(np.prod(w.shape) for w in model.weights))


def _check_memory(to: Placement, parameters: int, memory_bytes: float | None) -> None:
    """A replica of mirrored strategies holds the whole model and its slots; a ps task its share."""
    sharing = to.devices if MigrationStrategy(to.strategy).in_one_process else to.workers + to.ps + 1
    available = memory_bytes if memory_bytes is not None else _machine_memory() / sharing
    needed = parameters * _BYTES_PER_PARAMETER
    if to.strategy is MigrationStrategy.PARAMETER_SERVER:
        needed = -(-needed // to.ps)
    if needed > available:
        raise MigrationError(f"{to.describe()} cannot hold the model: {parameters:,} parameters need about "
                             f"{needed:,} bytes with the optimizer's slots per "
                             f"{'ps task' if to.ps else 'replica'}, and each has {int(available):,}. Use fewer "
                             "replicas on this machine, or more ps tasks.")


def _machine_memory() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def job_model(job: Path, args: Sequence[str] = ()) -> Any:
    """The job's model, built in this process (on its default device) only to read its fingerprint."""
    from tensorfleet.cluster.resumable import load_job

    return load_job(job, args).build_model()


@renamed(directory="out_dir", sink="log", quiet=("verbose", operator.not_))
def migrate(job: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, to: Placement,
            run: RunOptions | None = None, resume: bool | None = None, memory_bytes: float | None = None,
            log: Callable[[str], None] | None = None, verbose: bool = False,
            check: bool = True, timeout: float | None = None, args: Sequence[str] = (), max_restarts: int = 0,
            backoff: float = 1.0, hang_timeout: float | None = None, ports: Sequence[int] | None = None,
            mode: JobMode | str = JobMode.AUTO) -> LaunchResult:
    """Runs (or continues) the migratable ``job`` under ``to``, with its checkpoints in ``out_dir``.

    Args:
        job: a job file defining ``build_model()`` and ``data()`` (see :mod:`~tensorfleet.cluster.resumable`).
        out_dir: the migration checkpoint directory; created if it does not exist.
        to: the placement to run under.
        run: epochs, batch policy, seed, how often to save and where to stop (``stop_at_step``:
            the job saves there and ends with status 75, ready to move); default: when resuming,
            the checkpoint's (:meth:`RunOptions.from_progress`), else ``RunOptions()``.
            A SIGTERM or SIGINT to a task, or to this process, stops the job at the next step
            boundary, saved (see the module).
        resume: continue from ``out_dir``'s checkpoint; default: when it holds one.
        args: the job file's arguments: its ``sys.argv[1:]`` while it is read and its functions run.
        max_restarts, backoff: restarts after a failure (see :class:`~tensorfleet.cluster.launch_options.Recovery`);
            a restarted task continues from the job's last checkpoint in ``out_dir`` (``save_every``
            sets how much a failure costs).
        memory_bytes, log, verbose, check, timeout, hang_timeout, ports, mode: see
            :func:`check_migration`, :func:`~tensorfleet.cluster.launcher.launch` and its groups.

    Returns:
        The launch's :class:`~tensorfleet.cluster.result.LaunchResult` (``stopped`` when it ended at
        ``stop_at_step`` or on a signal; ``returncode`` 75 when this process was signalled).

    Raises:
        FileNotFoundError: no job file.
        CheckpointError, MigrationError: see :func:`check_migration`; nothing was started and the
            checkpoint is as it was.
        LaunchFailedError: with ``check``, the job failed (a stop to move is not a failure).
    """
    from tensorfleet.cluster.jobstate import LATEST
    from tensorfleet.cluster.launch_options import Recovery, TaskCommand, TaskOutput, Timeouts
    from tensorfleet.cluster.launcher import LaunchFailedError, launch

    path = Path(job)
    if not path.is_file():
        raise FileNotFoundError(f"The job file does not exist. Received: job={str(job)!r}")
    if resume is None:
        resume = (Path(out_dir) / LATEST).exists()
    if run is None:
        run = RunOptions.from_progress(read_state(out_dir)[0]) if resume else RunOptions()
    check_migration(out_dir, to=to, run=run, model=job_model(path, args), resume=resume, memory_bytes=memory_bytes)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    options = TaskOptions.of(run, out_dir=out_dir, to=to, resume=resume)
    result = launch(path, args, workers=to.workers, ps=to.ps, ports=ports, mode=mode,
                    recovery=Recovery(max_restarts=max_restarts, backoff=backoff),
                    timeouts=Timeouts(timeout=timeout, hang_timeout=hang_timeout, grace=_STOP_GRACE),
                    output=TaskOutput(log=log, verbose=verbose),
                    command=TaskCommand(runner=("-m", "tensorfleet.cluster.resumable"),
                                        env={**options.to_env(), "TF_CPP_MIN_LOG_LEVEL": "2"}),
                    check=False)
    if check and not result.ok and not result.stopped:
        raise LaunchFailedError(result.error or f"The job failed with status {result.returncode}.", result)
    return result
