"""The server a worker or ps task of a parameter-server job runs instead of the script.

In a parameter-server job only the chief (the coordinator) runs the training script; workers and
ps tasks serve a ``tf.distribute.Server``. The launcher and a TFJob start them with
``python -P -m tensorfleet.cluster.launcher --serve`` (:data:`~tensorfleet.cluster.contract.SERVE_ARGS`).
"""

from __future__ import annotations

import os
import signal
from typing import Any, Mapping

from tensorfleet.cluster.contract import ENV_MIGRATION, SERVING
from tensorfleet.strategies.tf_config import TFConfigError, parse_tf_config

__all__ = ["serve"]


def serve(tf_config: str | Mapping[str, Any] | None = None) -> None:
    """Runs this process's task of a parameter-server cluster as a ``tf.distribute.Server``.

    The server gets :func:`tensorfleet.strategies.servers.worker_server_config` (at
    least ``workers + 1`` inter-op threads: with fewer, a 2-core machine deadlocks in the
    first epoch). Blocks until the process is stopped.

    Example (reads TF_CONFIG; what the launcher runs for ps and worker tasks):
        >>> serve()  # doctest: +SKIP
    """
    from tensorfleet.strategies.servers import start_server

    raw = tf_config if tf_config is not None else os.environ.get("TF_CONFIG", "")
    config = parse_tf_config(raw)
    if config.task is None:
        raise TFConfigError("TF_CONFIG has no 'task'; the server needs to know which task it is.")
    if ENV_MIGRATION in os.environ:
        # A migratable job stops on SIGTERM/SIGINT at a step boundary, and its chief needs the variables on
        # the ps tasks (and the workers' steps) until its checkpoint is written: the servers outlive the
        # signal and end by SIGKILL (the launcher's once the chief has exited, Kubernetes' after its grace).
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
    server = start_server(config.cluster, config.task.role, config.task.index)
    SERVING.say(task=config.task, address=config.task.address)
    server.join()
