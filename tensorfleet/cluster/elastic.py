"""Elastic restarts: a job continues from its backup at another number of workers.

A multi-worker mirrored job cannot change size while it runs (the collective group is fixed
when the strategy is built), but it can be stopped and started again at another size from
the same ``BackupAndRestore`` directory: variables are saved without their placement, so a
backup written by 2 workers restores on 1 and the other way round. :func:`launch_elastic`
runs such a schedule of phases with the local launcher; :func:`batch_sizes` applies the
global batch size policy that decides what changes with the number of replicas:

* ``keep_global``: the global batch (and so the optimisation) stays the same; each replica
  gets ``global / replicas`` examples, which must divide evenly.
* ``keep_per_replica``: each replica keeps its batch; the global batch grows and shrinks with
  the job (``scale_lr`` / ``launch --scale-lr linear:REFERENCE`` scales the learning rate with it).

Example:
    >>> batch_sizes(2, policy="keep_global", global_batch_size=64)
    BatchSizes(global_batch_size=64, per_replica_batch_size=32, replicas=2)
    >>> batch_sizes(1, policy="keep_per_replica", per_replica_batch_size=32)
    BatchSizes(global_batch_size=32, per_replica_batch_size=32, replicas=1)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

from tensorfleet.cluster.contract import ENV_BATCH_POLICY, ENV_SCALE_LR, ENV_STOP_AFTER_EPOCH
from tensorfleet.validation import choice, positive_int, renamed

if TYPE_CHECKING:
    from tensorfleet.cluster.result import LaunchResult

__all__ = ["BatchPolicy", "BatchSizes", "ElasticPhase", "batch_sizes", "launch_elastic", "policy_from_env"]


class BatchPolicy(str, Enum):
    """What stays fixed when the number of replicas changes."""

    KEEP_GLOBAL = "keep_global"
    KEEP_PER_REPLICA = "keep_per_replica"


class BatchSizes(NamedTuple):
    global_batch_size: int
    per_replica_batch_size: int
    replicas: int


def _resolve_policy(policy: BatchPolicy | str) -> BatchPolicy:
    return choice(BatchPolicy, "policy", policy)


def batch_sizes(
    replicas: int,
    *,
    policy: BatchPolicy | str = BatchPolicy.KEEP_GLOBAL,
    global_batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
) -> BatchSizes:
    """Global and per-replica batch sizes for ``replicas`` under ``policy``.

    ``keep_global`` needs ``global_batch_size``; ``keep_per_replica`` needs
    ``per_replica_batch_size``.

    Raises:
        ValueError: an unknown policy, a missing or non-positive size, or a global batch
            that does not split evenly over the replicas.
    """
    positive_int("replicas", replicas)
    resolved = _resolve_policy(policy)
    if resolved is BatchPolicy.KEEP_GLOBAL:
        if global_batch_size is None:
            raise ValueError("policy='keep_global' needs global_batch_size. Received: global_batch_size=None")
        positive_int("global_batch_size", global_batch_size)
        if global_batch_size % replicas:
            raise ValueError(
                f"global_batch_size must be divisible by the number of replicas under 'keep_global'. "
                f"Received: global_batch_size={global_batch_size}, replicas={replicas}"
            )
        return BatchSizes(global_batch_size, global_batch_size // replicas, replicas)
    if per_replica_batch_size is None:
        raise ValueError(
            "policy='keep_per_replica' needs per_replica_batch_size. Received: per_replica_batch_size=None"
        )
    positive_int("per_replica_batch_size", per_replica_batch_size)
    return BatchSizes(per_replica_batch_size * replicas, per_replica_batch_size, replicas)


@dataclass(frozen=True)
class ElasticPhase:
    """One phase of an elastic schedule: run at ``workers`` until ``until_epoch`` has ended.

    ``until_epoch=None`` runs the job to its end.
    """

    workers: int
    until_epoch: int | None = None


@renamed(sink="log")
def launch_elastic(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    phases: Sequence[ElasticPhase],
    backup_dir: str | os.PathLike[str],
    policy: BatchPolicy | str = BatchPolicy.KEEP_GLOBAL,
    log: Callable[[str], None] | None = None,
    scale_lr: str | None = None,
    **launch_kwargs: Any,
) -> list[LaunchResult]:
    """Runs ``script`` through a schedule of worker counts, all sharing one backup directory.

    Each phase launches the job at its number of workers; with ``until_epoch`` it passes
    ``TENSORFLEET_STOP_AFTER_EPOCH``, so that the script's
    :func:`~tensorfleet.cluster.fault_tolerance.callbacks` end every task right after that
    epoch's backup (exit status 75, a planned stop), the way a preempted job ends. The next
    phase resumes from that backup. The batch policy reaches the script as
    ``TENSORFLEET_BATCH_POLICY`` (see :func:`policy_from_env`); ``scale_lr`` (``"linear:64"``: the rule and the
    global batch the script's learning rate is for) as ``TENSORFLEET_SCALE_LR``, which the script's
    :func:`~tensorfleet.cluster.fault_tolerance.callbacks` turn into the learning rate of each phase's global batch.

    ``launch_kwargs`` are more of :func:`~tensorfleet.cluster.launcher.launch`'s options (``timeouts``,
    ``recovery``, ``command``, ``output``, ``ports``, ...); every phase gets ``backup_dir`` as its
    ``recovery.backup_dir``, and ``log`` unless ``output`` is given.

    Returns:
        One :class:`~tensorfleet.cluster.result.LaunchResult` per phase.

    Example:
        >>> results = launch_elastic("train.py", phases=[ElasticPhase(2, 2), ElasticPhase(1, 4), ElasticPhase(2)],
        ...                          backup_dir="/tmp/job")  # doctest: +SKIP
    """
    from tensorfleet.cluster.launch_options import Recovery, TaskCommand, TaskOutput
    from tensorfleet.cluster.launcher import launch

    _check_phases(phases)
    command = launch_kwargs.pop("command", None) or TaskCommand()
    recovery = replace(launch_kwargs.pop("recovery", None) or Recovery(), backup_dir=backup_dir)
    output = launch_kwargs.pop("output", None) or TaskOutput(log=log)
    base_env = dict(command.env or {})
    base_env[ENV_BATCH_POLICY] = _resolve_policy(policy).value
    if scale_lr is not None:
        from tensorfleet.strategies.large_batch import parse_scale_lr

        parse_scale_lr(scale_lr)  # a bad value fails before any phase starts
        base_env[ENV_SCALE_LR] = scale_lr
    results = []
    for phase in phases:
        env = dict(base_env)
        if phase.until_epoch is not None:
            env[ENV_STOP_AFTER_EPOCH] = str(phase.until_epoch)
        results.append(launch(script, args, workers=phase.workers, recovery=recovery,
                              command=replace(command, env=env), output=output, **launch_kwargs))
    return results


def _check_phases(phases: Sequence[ElasticPhase]) -> None:
    """Phases end at increasing epochs; only the last may run to the end."""
    if not phases:
        raise ValueError("phases must list at least one ElasticPhase. Received: phases=[]")
    previous = 0
    for i, phase in enumerate(phases):
        if not isinstance(phase, ElasticPhase):
            raise TypeError(f"phases[{i}] must be an ElasticPhase. Received: {phase!r}")
        positive_int(f"phases[{i}].workers", phase.workers)
        if phase.until_epoch is None:
            if i != len(phases) - 1:
                raise ValueError(f"Only the last phase may run to the end (until_epoch=None). Received: phases[{i}]")
            continue
        positive_int(f"phases[{i}].until_epoch", phase.until_epoch)
        if phase.until_epoch <= previous:
            raise ValueError(f"phases must end at increasing epochs. Received: phases[{i}].until_epoch="
                             f"{phase.until_epoch} after {previous}")
        previous = phase.until_epoch


def policy_from_env(default: BatchPolicy | str = BatchPolicy.KEEP_GLOBAL) -> BatchPolicy:
    """The batch policy an elastic launch passed to this process (``default`` otherwise)."""
    return _resolve_policy(os.environ.get(ENV_BATCH_POLICY) or default)

