"""The ``tf.distribute.Server`` of one cluster task, and a whole cluster started in this process.

The parameter server's workers and ps tasks only serve: each runs one server that the
coordinator (the chief) drives. :func:`start_server` starts the server of one task of a
:class:`~tensorfleet.strategies.tf_config.ClusterSpec`; :func:`start_in_process_cluster` starts
every worker and ps server of a local cluster in this process, which then coordinates.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tensorfleet.strategies.tf_config import ClusterSpec, Role
from tensorfleet.validation import positive_int

__all__ = ["ServerTask", "start_in_process_cluster", "start_server", "worker_server_config"]

log = logging.getLogger(__name__)


def worker_server_config(num_workers: int) -> Any:
    """The ConfigProto a worker or ps server needs.

    On a 2-core machine the parameter server hangs at the first epoch unless each worker
    server has at least ``num_workers + 1`` inter-op threads (TensorFlow defaults the pool to
    the core count), so the pool is sized to ``max(cores, num_workers + 1)``.
    """
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = max(os.cpu_count() or 1, num_workers + 1)
    return config


class ServerTask:
    """A running ``tf.distribute.Server`` for one task (TensorFlow cannot stop one; it lives
    until its process exits)."""

    def __init__(self, server: Any, role: str, index: int, address: str) -> None:
        self.server, self.role, self.index, self.address = server, role, index, address

    def join(self) -> None:
        self.server.join()


def start_server(cluster: ClusterSpec, role: str, index: int) -> ServerTask:
    """Starts the ``tf.distribute.Server`` of task ``role:index`` of ``cluster`` in this process."""
    import tensorflow as tf

    task = cluster.task(role, index)
    num_workers = cluster.num_tasks(Role.WORKER.value)
    server = tf.distribute.Server(
        cluster.to_tf(), job_name=role, task_index=index, protocol="grpc",
        config=worker_server_config(num_workers), start=True,
    )
    log.info("Started %s server at %s", task, task.address)
    return ServerTask(server, role, index, task.address)


def start_in_process_cluster(*, workers: int = 2, ps: int = 1) -> ClusterSpec:
    """Starts ``workers`` worker and ``ps`` parameter servers in this process on 127.0.0.1.

    The calling process is then the coordinator: pass the returned spec as
    ``build("parameter_server", cluster=spec)``. For tests, notebooks and single-machine runs.

    Example (servers cannot be stopped, so this does not run as a doctest):
        >>> spec = start_in_process_cluster(workers=2, ps=1)  # doctest: +SKIP
        >>> spec.num_tasks("worker"), spec.num_tasks("ps")  # doctest: +SKIP
        (2, 1)
        >>> start_in_process_cluster(ps=0)
        Traceback (most recent call last):
        ...
        ValueError: ps must be a positive integer. Received: ps=0
    """
    positive_int("workers", workers)
    positive_int("ps", ps)
    spec = ClusterSpec.local(workers=workers, ps=ps)
    for task in spec.tasks():
        start_server(spec, task.role, task.index)
    return spec
