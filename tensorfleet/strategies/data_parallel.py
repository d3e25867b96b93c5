"""Data-parallel strategies: TensorFlow's own, with validated options, registered by name.

Each factory returns the real ``tf.distribute`` strategy. Options are the ones TensorFlow
offers, under the words users type (``cross_device_ops="nccl"``,
``implementation="ring"``), checked before TensorFlow sees them.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
from enum import Enum
from typing import Any, Sequence

from tensorfleet.strategies.tf_config import ClusterSpec, Role, TFConfig, tf_config_from_env
from tensorfleet.strategies.registry import Availability, register
from tensorfleet.validation import choice, positive_int

__all__ = [
    "CrossDeviceOps",
    "CollectiveImplementation",
    "NoTPUError",
    "ServerTask",
    "central_storage",
    "mirrored",
    "multi_worker_mirrored",
    "one_device",
    "parameter_server",
    "start_in_process_cluster",
    "start_server",
    "tpu",
    "worker_server_config",
]

log = logging.getLogger(__name__)


class CrossDeviceOps(str, Enum):
    """How MirroredStrategy reduces gradients across local devices."""

    NCCL = "nccl"
    HIERARCHICAL_COPY = "hierarchical_copy"
    REDUCTION_TO_ONE_DEVICE = "reduction_to_one_device"


class CollectiveImplementation(str, Enum):
    """The collective implementation of MultiWorkerMirroredStrategy."""

    AUTO = "auto"
    RING = "ring"
    NCCL = "nccl"


class NoTPUError(RuntimeError):
    """No TPU can be reached from this machine."""


def _positive_int(key: str, value: Any, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    return positive_int(key, value)


def _device_list(key: str, devices: Sequence[str] | None) -> list[str] | None:
    if devices is None:
        return None
    if isinstance(devices, str) or not isinstance(devices, Sequence) or not devices:
        raise ValueError(f"{key} must be a non-empty list of device names. Received: {key}={devices!r}")
    import tensorflow as tf

    known = {d.name.lower() for d in tf.config.list_logical_devices()}
    resolved = []
    for device in devices:
        try:  # TensorFlow's own message ("Unknown attribute 'cpu0' ...") does not say what would be right
            spec = tf.DeviceSpec.from_string(device) if isinstance(device, str) else None
        except ValueError:
            spec = None
        if spec is None or spec.device_type is None:
            raise ValueError(f"{key} has an entry that is not a device name like '/cpu:0'. Received: {device!r}")
        full = f"/device:{spec.device_type.upper()}:{spec.device_index or 0}".lower()
        if full not in known:
            raise ValueError(
                f"{key} names {device!r}, which is not a device of this machine. Available: "
                f"{sorted(known)}. On a CPU-only machine, tensorfleet.strategies.simulate_devices(n) "
                "splits the CPU into n logical devices."
            )
        resolved.append(device)
    if len(set(d.lower() for d in resolved)) != len(resolved):
        raise ValueError(f"{key} lists a device twice. Received: {key}={list(devices)!r}")
    return resolved


def _local_device_count() -> int:
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return len(gpus) if gpus else len(tf.config.list_logical_devices("CPU"))


# --------------------------------------------------------------------------- one device


def one_device(*, device: str | None = None) -> Any:
    """``tf.distribute.OneDeviceStrategy`` on ``device`` (default: the first GPU, else CPU:0).

    Example:
        >>> one_device().extended.worker_devices
        ('/job:localhost/replica:0/task:0/device:CPU:0',)
        >>> one_device(device="cpu0")
        Traceback (most recent call last):
        ...
        ValueError: device has an entry that is not a device name like '/cpu:0'. Received: 'cpu0'
    """
    import tensorflow as tf

    if device is None:
        device = "/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"
    (device,) = _device_list("device", [device])  # type: ignore[misc]
    return tf.distribute.OneDeviceStrategy(device)


# --------------------------------------------------------------------------- mirrored


def mirrored(*, devices: Sequence[str] | None = None, cross_device_ops: str | None = None,
             num_packs: int = 1) -> Any:
    """``tf.distribute.MirroredStrategy``: synchronous replicas on this machine's devices.

    Args:
        devices: device names; default all GPUs, else all logical CPUs.
        cross_device_ops: ``"nccl"``, ``"hierarchical_copy"`` or ``"reduction_to_one_device"``;
            default TensorFlow's choice.
        num_packs: gradient packs for nccl / hierarchical_copy.

    Example (this machine has no GPU, so its logical CPUs stand in):
        >>> strategy = mirrored(devices=["/cpu:0", "/cpu:1"], cross_device_ops="hierarchical_copy")
        >>> strategy.num_replicas_in_sync, type(strategy.extended._cross_device_ops).__name__
        (2, 'HierarchicalCopyAllReduce')
        >>> mirrored(cross_device_ops="nccl")
        Traceback (most recent call last):
        ...
        ValueError: cross_device_ops='nccl' needs GPUs and this machine has none. Received: cross_device_ops='nccl'; use 'hierarchical_copy' or 'reduction_to_one_device'.
    """
    import tensorflow as tf

    devices = _device_list("devices", devices)
    if devices is None:
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
    _positive_int("num_packs", num_packs)
    ops = None
    if cross_device_ops is not None:
        kind = choice(CrossDeviceOps, "cross_device_ops", cross_device_ops)
        if kind is CrossDeviceOps.NCCL:
            if not tf.config.list_logical_devices("GPU"):
                raise ValueError(
                    "cross_device_ops='nccl' needs GPUs and this machine has none. Received: "
                    "cross_device_ops='nccl'; use 'hierarchical_copy' or 'reduction_to_one_device'."
                )
            ops = tf.distribute.NcclAllReduce(num_packs=num_packs)
        elif kind is CrossDeviceOps.HIERARCHICAL_COPY:
            ops = tf.distribute.HierarchicalCopyAllReduce(num_packs=num_packs)
        else:
            ops = tf.distribute.ReductionToOneDevice()
    return _new_mirrored(devices, ops)


_strategy_count = itertools.count(1)


def _new_mirrored(devices: list[str], ops: Any) -> Any:
    """A MirroredStrategy whose collective keys no other strategy of this process uses.

    Every MirroredStrategy numbers its collective groups and instances from the same start,
    so a second one in the same process (a notebook, a test session) collides with the first:
    over a different device count it fails with "is joining a group with size 4, but that
    group has size 2", over the same devices with "Shape mismatch in the collective instance".
    TensorFlow reads the key base from the instance during construction; each strategy built
    here gets its own, never TensorFlow's 0, whose group key 1 DTensor's collectives also take.
    """
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
    strategy._collective_key_base = 100_000 * next(_strategy_count)
    strategy.__init__(devices=devices, cross_device_ops=ops)
    return strategy


# --------------------------------------------------------------------------- central storage


def central_storage(*, compute_devices: Sequence[str] | None = None,
                    parameter_device: str | None = None) -> Any:
    """``CentralStorageStrategy``: variables on one device, compute on several.

    Example:
        >>> strategy = central_storage(compute_devices=["/cpu:0", "/cpu:1"], parameter_device="/cpu:2")
        >>> with strategy.scope():
        ...     import tensorflow as tf
        ...     v = tf.Variable(1.0)
        >>> strategy.num_replicas_in_sync, v.device
        (2, '/job:localhost/replica:0/task:0/device:CPU:2')
    """
    import tensorflow as tf

    compute_devices = _device_list("compute_devices", compute_devices)
    if parameter_device is not None:
        (parameter_device,) = _device_list("parameter_device", [parameter_device])  # type: ignore[misc]
    return tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=compute_devices, parameter_device=parameter_device
    )


# --------------------------------------------------------------------------- multi-worker


def multi_worker_mirrored(*, implementation: str = "auto", timeout_seconds: float | None = None,
                          tf_config: str | dict[str, Any] | None = None) -> Any:
    """``MultiWorkerMirroredStrategy``: synchronous replicas across the workers of TF_CONFIG.

    Args:
        implementation: collective implementation, ``"auto"``, ``"ring"`` or ``"nccl"``.
        timeout_seconds: fail a collective that waits longer (a lost peer) instead of
            hanging; None waits forever, as TensorFlow does.
        tf_config: a TF_CONFIG to validate and use instead of the environment's.

    Example (options are checked before TensorFlow sees them):
        >>> multi_worker_mirrored(implementation="nccl")
        Traceback (most recent call last):
        ...
        ValueError: implementation='nccl' needs GPUs and this machine has none. Received: implementation='nccl'; use 'ring' or 'auto'.
        >>> multi_worker_mirrored(timeout_seconds=0)
        Traceback (most recent call last):
        ...
        ValueError: timeout_seconds must be a positive number or None. Received: timeout_seconds=0
    """
    import tensorflow as tf

    kind = choice(CollectiveImplementation, "implementation", implementation)
    if kind is CollectiveImplementation.NCCL and not tf.config.list_physical_devices("GPU"):
        raise ValueError("implementation='nccl' needs GPUs and this machine has none. "
                         "Received: implementation='nccl'; use 'ring' or 'auto'.")
    if timeout_seconds is not None and (isinstance(timeout_seconds, bool)
                                        or not isinstance(timeout_seconds, (int, float)) or timeout_seconds <= 0):
        raise ValueError(f"timeout_seconds must be a positive number or None. Received: timeout_seconds={timeout_seconds!r}")
    resolver = None
    if tf_config is not None:
        from tensorfleet.strategies.tf_config import parse_tf_config

        resolver = _resolver(parse_tf_config(tf_config))
    else:
        tf_config_from_env()  # validate the environment's TF_CONFIG with clear errors
    impl = {
        CollectiveImplementation.AUTO: tf.distribute.experimental.CommunicationImplementation.AUTO,
        CollectiveImplementation.RING: tf.distribute.experimental.CommunicationImplementation.RING,
        CollectiveImplementation.NCCL: tf.distribute.experimental.CommunicationImplementation.NCCL,
    }[kind]
    options = tf.distribute.experimental.CommunicationOptions(implementation=impl, timeout_seconds=timeout_seconds)
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)


def _resolver(config: TFConfig) -> Any:
    import tensorflow as tf

    task_type = config.task.role if config.task else None
    task_id = config.task.index if config.task else None
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        config.cluster.to_tf(), task_type=task_type, task_id=task_id, rpc_layer=config.rpc_layer or "grpc"
    )


# --------------------------------------------------------------------------- parameter server


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
    """
    _positive_int("workers", workers)
    _positive_int("ps", ps)
    spec = ClusterSpec.local(workers=workers, ps=ps)
    for task in spec.tasks():
        start_server(spec, task.role, task.index)
    return spec


def parameter_server(*, cluster: ClusterSpec | dict[str, Any] | None = None,
                     max_shards: int | None = None, min_shard_bytes: int | None = None,
                     staleness: int | str | None = None, serve: bool = True) -> Any:
    """``ParameterServerStrategy``: workers train asynchronously against variables on ps tasks.

    The cluster comes from ``cluster`` (a :class:`ClusterSpec`, e.g. from
    :func:`start_in_process_cluster`) or from TF_CONFIG. When TF_CONFIG says this process is a
    ``worker`` or ``ps`` task and ``serve`` is true, its server is started and this call
    blocks serving it, as those tasks only serve; only the chief (the coordinator) gets a
    strategy back.

    Args:
        cluster: the cluster; default TF_CONFIG.
        max_shards: split each variable into at most this many shards across the ps tasks
            (``tf.distribute.experimental.partitioners.MinSizePartitioner``).
        min_shard_bytes: smallest shard, in bytes (default 256 KiB when max_shards is set).
        staleness: the consistency model (:mod:`tensorfleet.strategies.staleness`): 0 is
            bulk-synchronous, k lets a worker run at most k steps ahead of the slowest, None
            (TensorFlow's behaviour) is fully asynchronous.
        serve: on worker/ps tasks, start the server and block.

    Example (the coordinator of a cluster in this process; it cannot run inside the test
    suite, where connecting to a cluster would change the process's eager context for good):
        >>> spec = start_in_process_cluster(workers=2, ps=1)  # doctest: +SKIP
        >>> strategy = parameter_server(cluster=spec, staleness=2)  # doctest: +SKIP

    Bad options fail before anything starts:
        >>> parameter_server(min_shard_bytes=1024)
        Traceback (most recent call last):
        ...
        ValueError: min_shard_bytes only applies with max_shards. Received: min_shard_bytes=1024, max_shards=None
    """
    import tensorflow as tf

    from tensorfleet.strategies import staleness as consistency

    consistency.resolve_staleness(staleness)  # a bad value fails before anything starts

    _positive_int("max_shards", max_shards, allow_none=True)
    _positive_int("min_shard_bytes", min_shard_bytes, allow_none=True)
    if min_shard_bytes is not None and max_shards is None:
        raise ValueError("min_shard_bytes only applies with max_shards. Received: "
                         f"min_shard_bytes={min_shard_bytes}, max_shards=None")
    if cluster is None:
        config = tf_config_from_env()
        if config is None:
            raise ValueError(
                "parameter_server needs a cluster: set TF_CONFIG (a cluster with 'ps' and 'worker' "
                "tasks), pass cluster=tensorfleet.strategies.start_in_process_cluster(), or use "
                "'tensorfleet launch --ps 1 --workers 2 SCRIPT'. Received: cluster=None and no TF_CONFIG."
            )
        spec, task = config.cluster, config.task
    else:
        spec = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec(dict(cluster))
        task = None
    if spec.num_tasks(Role.PS.value) == 0 or spec.num_tasks(Role.WORKER.value) == 0:
        raise ValueError(
            "parameter_server needs at least one 'ps' and one 'worker' task. Received cluster: "
            f"{spec.as_dict()}"
        )
    if task is not None and task.role in (Role.WORKER.value, Role.PS.value):
        if serve:
            log.info("TF_CONFIG task %s serves the cluster; blocking.", task)
            start_server(spec, task.role, task.index).join()
        raise ValueError(f"Task {task} of the cluster serves variables or steps; only the chief "
                         "coordinates a parameter-server job.")
    partitioner = None
    if max_shards is not None:
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=min_shard_bytes or (256 << 10), max_shards=max_shards
        )
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec.to_tf(),
        task_type=task.role if task else None,
        task_id=task.index if task else None,
        rpc_layer="grpc",
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    consistency.attach(strategy, staleness)
    return strategy


# --------------------------------------------------------------------------- TPU


def _parse_tpu_address(tpu_address: str) -> tuple[str, int] | None:
    """(host, port) for a grpc://host:port address; None for a TPU name."""
    if tpu_address.startswith("grpc://"):
        rest = tpu_address[len("grpc://"):]
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"tpu_address must look like 'grpc://host:8470'. Received: tpu_address={tpu_address!r}")
        return host, int(port)
    if "://" in tpu_address or not tpu_address.replace("-", "").replace("_", "").isalnum():
        raise ValueError(
            "tpu_address must be a TPU name (letters, digits, '-', '_') or 'grpc://host:port'. "
            f"Received: tpu_address={tpu_address!r}"
        )
    return None


def local_tpu_devices() -> list[str]:
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices("TPU")]


def tpu(*, tpu_address: str | None = None, zone: str | None = None, project: str | None = None,
        connect_timeout: float = 5.0) -> Any:
    """``TPUStrategy`` over the TPU at ``tpu_address`` (a name or ``grpc://host:port``).

    Without an address, uses a TPU attached to this machine or named by ``TPU_NAME``. When
    none is there, raises :class:`NoTPUError` without touching the network.

    Example (this machine has no TPU):
        >>> tpu()
        Traceback (most recent call last):
        ...
        tensorfleet.strategies.data_parallel.NoTPUError: No TPU is attached to this machine and no tpu_address (or TPU_NAME) was given. ...
    """
    import tensorflow as tf

    if tpu_address is None:
        tpu_address = os.environ.get("TPU_NAME")
    if tpu_address is not None:
        if not isinstance(tpu_address, str) or not tpu_address:
            raise ValueError(f"tpu_address must be a non-empty string. Received: tpu_address={tpu_address!r}")
        endpoint = _parse_tpu_address(tpu_address)
        if endpoint is not None:
            try:
                socket.create_connection(endpoint, timeout=connect_timeout).close()
            except OSError as exc:
                raise NoTPUError(f"No TPU worker answers at {tpu_address} ({exc.strerror or exc}). "
                                 "Check the address, or build 'mirrored' or 'one_device' instead.") from None
        elif zone is None and project is None and not _on_cloud_vm():
            raise NoTPUError(
                f"The TPU name {tpu_address!r} can only be resolved on a Cloud VM (or with zone= and "
                "project=). This machine is neither; pass tpu_address='grpc://host:port' instead."
            )
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_address, zone=zone, project=project)
        tf.config.experimental_connect_to_cluster(resolver)
    else:
        if not local_tpu_devices():
            raise NoTPUError(
                "No TPU is attached to this machine and no tpu_address (or TPU_NAME) was given. "
                "Received: tpu_address=None. Pass tpu_address='grpc://host:8470' or a TPU name, or "
                "build 'mirrored' or 'one_device' instead."
            )
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def _on_cloud_vm() -> bool:
    return os.path.exists("/sys/class/dmi/id/product_name") and "Google" in open(
        "/sys/class/dmi/id/product_name", encoding="utf-8", errors="ignore").read()


# --------------------------------------------------------------------------- availability


def _check_mirrored() -> Availability:
    n = _local_device_count()
    if n > 1:
        return Availability(True, f"{n} local devices")
    return Availability(True, "1 local device (simulate_devices(n) splits the CPU)")


def _check_multi_worker() -> Availability:
    config = tf_config_from_env()
    if config is None:
        return Availability(True, "no TF_CONFIG: runs as one worker; 'tensorfleet launch' starts several")
    return Availability(True, f"TF_CONFIG with {config.num_workers} worker(s)")


def _check_parameter_server() -> Availability:
    config = tf_config_from_env()
    if config is not None and config.has_ps:
        return Availability(True, "TF_CONFIG has ps tasks")
    return Availability(True, "needs a cluster: TF_CONFIG with ps tasks, or start_in_process_cluster()")


def _check_tpu() -> Availability:
    if local_tpu_devices():
        return Availability(True, "a TPU is attached")
    if os.environ.get("TPU_NAME"):
        return Availability(True, f"TPU_NAME={os.environ['TPU_NAME']}")
    return Availability(False, "no TPU attached and no TPU_NAME")


register("one_device", one_device, aliases=("single", "default"),
         description="OneDeviceStrategy: everything on one device.")
register("mirrored", mirrored, aliases=("mirror",), check=_check_mirrored,
         description="MirroredStrategy: synchronous data parallelism over this machine's devices.")
register("multi_worker_mirrored", multi_worker_mirrored, aliases=("mwms", "multi_worker"),
         check=_check_multi_worker,
         description="MultiWorkerMirroredStrategy: synchronous all-reduce across TF_CONFIG workers.")
register("parameter_server", parameter_server, aliases=("ps",), check=_check_parameter_server,
         description="ParameterServerStrategy: asynchronous workers, variables on ps tasks.")
register("central_storage", central_storage, aliases=("central",),
         description="CentralStorageStrategy: variables on one device, compute mirrored.")
register("tpu", tpu, check=_check_tpu, description="TPUStrategy on an attached or addressed TPU.")
