"""Running a job on many processes: locally, with fault tolerance and elastic restarts, or on
Kubernetes.

* :func:`launch` starts one process per task of a tf.distribute cluster on this machine
  (:mod:`tensorfleet.cluster.launcher`), restarts failed tasks and resumes from backups.
* :mod:`~tensorfleet.cluster.fault_tolerance`: the callbacks a job needs to survive a killed worker.
* :mod:`~tensorfleet.cluster.elastic`: continue a job at another number of workers.
* :mod:`~tensorfleet.cluster.k8s`: the same job as a Kubeflow ``TFJob``.
* The cluster itself (``ClusterSpec``, TF_CONFIG) is defined where the strategies read it,
  :mod:`tensorfleet.strategies.tf_config`, and is one import away here too.
"""

from __future__ import annotations

import importlib
from typing import Any

from tensorfleet.strategies.tf_config import ClusterSpec, Role, TFConfig, TFConfigError, parse_tf_config

_LAZY_MODULES = ("elastic", "fault_tolerance", "k8s", "launcher")
_LAZY_NAMES = {"launch": "launcher", "launch_elastic": "elastic", "tfjob": "k8s"}

__all__ = ["ClusterSpec", "Role", "TFConfig", "TFConfigError", "parse_tf_config", *_LAZY_MODULES, *_LAZY_NAMES]


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
