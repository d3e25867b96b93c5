"""Running a job on many processes: locally, with fault tolerance and elastic restarts, or on
Kubernetes.

* :func:`launch` starts one process per task of a tf.distribute cluster on this machine
  (:mod:`tensorfleet.cluster.launcher`; its options in groups, :class:`Recovery`, :class:`Timeouts`,
  :class:`TaskOutput`, :class:`TaskCommand`), restarts failed tasks and resumes from backups; its
  parts are the task processes (:mod:`~tensorfleet.cluster.processes`), the supervision state
  machine (:mod:`~tensorfleet.cluster.supervisor`), the record of a run
  (:mod:`~tensorfleet.cluster.result`) and the server of parameter-server tasks
  (:mod:`~tensorfleet.cluster.server`).
* :mod:`~tensorfleet.cluster.contract`: what the launcher tells its tasks and how they answer
  (environment variables, the lines they write, exit statuses), one set for the launcher, the
  callbacks, migratable jobs and a TFJob.
* :mod:`~tensorfleet.cluster.fault_tolerance`: the callbacks a job needs to survive a killed worker.
* :mod:`~tensorfleet.cluster.elastic`: continue a job at another number of workers.
* :mod:`~tensorfleet.cluster.migration`: move a job to another world size or strategy from one
  checkpoint (:mod:`~tensorfleet.cluster.jobstate`), trained by :mod:`~tensorfleet.cluster.resumable`;
  :mod:`~tensorfleet.cluster.multiplex`: such jobs sharing the devices by time slices at step boundaries.
* :mod:`~tensorfleet.cluster.k8s`: the same job as a Kubeflow ``TFJob``.
* The cluster itself (``ClusterSpec``, TF_CONFIG) is defined where the strategies read it,
  :mod:`tensorfleet.strategies.tf_config`, and is one import away here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorfleet.lazy import attach
from tensorfleet.strategies.tf_config import ClusterSpec, Role, TFConfig, TFConfigError, parse_tf_config

__getattr__, _LAZY = attach(
    __name__,
    names={"launch": "launcher", "launch_elastic": "elastic", "migrate": "migration", "share": "multiplex",
           "tfjob": "k8s",
           "Recovery": "launch_options", "Timeouts": "launch_options", "TaskOutput": "launch_options",
           "TaskCommand": "launch_options",
           "callbacks": "fault_tolerance", "callback_class": "fault_tolerance", "resumed_epoch": "fault_tolerance",
           "checkpoint_callback": "evaluation", "sidecar_evaluation": "evaluation:evaluation",
           "BatchPolicy": "elastic", "batch_sizes": "elastic", "policy_from_env": "elastic",
           "MigrationError": "migration", "Placement": "migration", "RunOptions": "migration", "SharedJob": "multiplex",
           "read_state": "jobstate", "SpeedMeter": "balance", "proportional_split": "balance"},
    internal=("contract", "elastic", "evaluation", "fault_tolerance", "jobstate", "k8s", "launcher", "migration",
              "multiplex", "processes", "ps_balance", "result", "resumable", "server", "supervisor"),
)

if TYPE_CHECKING:  # what the lazy map above serves, for editors and type checkers (not run)
    from tensorfleet.cluster.balance import SpeedMeter, proportional_split
    from tensorfleet.cluster.elastic import BatchPolicy, batch_sizes, launch_elastic, policy_from_env
    from tensorfleet.cluster.evaluation import checkpoint_callback, evaluation as sidecar_evaluation
    from tensorfleet.cluster.fault_tolerance import callback_class, callbacks, resumed_epoch
    from tensorfleet.cluster.jobstate import read_state
    from tensorfleet.cluster.k8s import tfjob
    from tensorfleet.cluster.launch_options import Recovery, TaskCommand, TaskOutput, Timeouts
    from tensorfleet.cluster.launcher import launch
    from tensorfleet.cluster.migration import MigrationError, Placement, RunOptions, migrate
    from tensorfleet.cluster.multiplex import SharedJob, share

__all__ = ["ClusterSpec", "Role", "TFConfig", "TFConfigError", "parse_tf_config", *_LAZY]
