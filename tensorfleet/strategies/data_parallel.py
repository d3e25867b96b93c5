"""Data-parallel strategies: TensorFlow's own, with validated options, registered by name.

Each factory returns the real ``tf.distribute`` strategy. Options are the ones TensorFlow
offers, under the words users type (``cross_device_ops="nccl"``,
``implementation="ring"``), checked before TensorFlow sees them. The parameter server's task
servers are in :mod:`tensorfleet.strategies.servers`, the TPU strategy in
:mod:`tensorfleet.strategies.tpu`.
"""

from __future__ import annotations

import itertools
import logging
from enum import Enum
from typing import Any, Sequence, overload

from tensorfleet.compat import distribute as tf_internals, keras3 as keras3_mends, keras3_metrics
from tensorfleet.strategies.compression import attach as attach_compression, parse_compression
from tensorfleet.strategies.devices import local_devices
from tensorfleet.strategies.registry import Availability, register
from tensorfleet.strategies.servers import start_server
from tensorfleet.strategies.staleness import attach, resolve_staleness
from tensorfleet.strategies.tf_config import ClusterSpec, Role, Task, parse_tf_config, tf_config_from_env
from tensorfleet.validation import choice, integer, number, positive_int

__all__ = [
    "CrossDeviceOps",
    "CollectiveImplementation",
    "central_storage",
    "mirrored",
    "multi_worker_mirrored",
    "one_device",
    "parameter_server",
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


@overload
def _device_list(key: str, devices: None) -> None: ...


@overload
def _device_list(key: str, devices: Sequence[str]) -> list[str]: ...


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
    (device,) = _device_list("device", [device])
    return tf.distribute.OneDeviceStrategy(device)


# --------------------------------------------------------------------------- mirrored


def mirrored(*, devices: Sequence[str] | None = None, cross_device_ops: str | None = None,
             num_packs: int = 1, compression: str | None = None) -> Any:
    """``tf.distribute.MirroredStrategy``: synchronous replicas on this machine's devices.

    Args:
        devices: device names; default all GPUs, else all logical CPUs.
        cross_device_ops: ``"nccl"``, ``"hierarchical_copy"`` or ``"reduction_to_one_device"``;
            default TensorFlow's choice.
        num_packs: gradient packs for nccl / hierarchical_copy.
        compression: the gradients' all-reduce compressed: ``"fp16"``, ``"bf16"``, ``"powersgd:rank=2"``
            (:mod:`tensorfleet.strategies.compression`; ``"none"`` counts the bytes of Keras's own sum).

    Example (this machine has no GPU, so its logical CPUs stand in):
        >>> strategy = mirrored(devices=["/cpu:0", "/cpu:1"], cross_device_ops="hierarchical_copy")
        >>> strategy.num_replicas_in_sync, type(strategy.extended._cross_device_ops).__name__
        (2, 'HierarchicalCopyAllReduce')
        >>> mirrored(cross_device_ops="nccl")
        Traceback (most recent call last):
        ...
        ValueError: cross_device_ops='nccl' needs GPUs and this machine has none. Received: cross_device_ops='nccl'; use
        'hierarchical_copy' or 'reduction_to_one_device'.
    """
    import tensorflow as tf

    devices = _device_list("devices", devices)
    if devices is None:
        devices = [d.name for d in local_devices()]
    positive_int("num_packs", num_packs)
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
    parse_compression(compression)  # a bad value fails before TensorFlow starts
    _mend_keras3_fit()
    strategy = _new_mirrored(devices, ops)
    attach_compression(strategy, compression)
    return strategy


def _mend_keras3_fit(*, central_storage: bool = False) -> None:
    """Mends Keras 3's trainer where a user's Keras 3 model will train under this strategy: its sample batch
    for building (fails across workers, keras-team/keras#20585, and for a first batch that does not split
    evenly over the replicas), and under central storage its metrics (keras-team/keras#19280). A process
    that uses tf_keras only is left as it is."""
    keras3_mends.mend_fit()
    if central_storage:
        keras3_metrics.mend_central_storage_metrics()


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
    return tf_internals.new_mirrored_strategy(devices, ops, collective_key_base=100_000 * next(_strategy_count))


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
        (parameter_device,) = _device_list("parameter_device", [parameter_device])
    _mend_keras3_fit(central_storage=True)
    return tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=compute_devices, parameter_device=parameter_device
    )


# --------------------------------------------------------------------------- multi-worker


def multi_worker_mirrored(*, implementation: str = "auto", timeout_seconds: float | None = None,
                          tf_config: str | dict[str, Any] | None = None, compression: str | None = None) -> Any:
    """``MultiWorkerMirroredStrategy``: synchronous replicas across the workers of TF_CONFIG.

    A Keras 3 model's ``fit``, ``evaluate`` and ``predict`` work under it: Keras 3's own fail there
    (keras-team/keras#20585), so building this strategy in a process that uses Keras 3 installs
    :func:`tensorfleet.compat.keras3.mend_fit` (Keras 3.15; another version is left as it is,
    with a warning).

    Args:
        implementation: collective implementation, ``"auto"``, ``"ring"`` or ``"nccl"``.
        timeout_seconds: fail a collective that waits longer (a lost peer) instead of
            hanging; None waits forever, as TensorFlow does.
        tf_config: a TF_CONFIG to validate and use instead of the environment's.
        compression: the gradients' all-reduce compressed, as for :func:`mirrored`.

    Example (options are checked before TensorFlow sees them):
        >>> multi_worker_mirrored(implementation="nccl")
        Traceback (most recent call last):
        ...
        ValueError: implementation='nccl' needs GPUs and this machine has none. Received: implementation='nccl'; use
        'ring' or 'auto'.
        >>> multi_worker_mirrored(timeout_seconds=0)
        Traceback (most recent call last):
        ...
        ValueError: timeout_seconds must be a finite number > 0. Received: timeout_seconds=0
    """
    import tensorflow as tf

    kind = choice(CollectiveImplementation, "implementation", implementation)
    if kind is CollectiveImplementation.NCCL and not tf.config.list_physical_devices("GPU"):
        raise ValueError("implementation='nccl' needs GPUs and this machine has none. "
                         "Received: implementation='nccl'; use 'ring' or 'auto'.")
    timeout_seconds = number("timeout_seconds", timeout_seconds, above=0, optional=True)
    parse_compression(compression)
    resolver = None
    # the given TF_CONFIG or the environment's, validated with clear errors
    config = parse_tf_config(tf_config) if tf_config is not None else tf_config_from_env()
    if tf_config is not None and config is not None:
        resolver = _cluster_resolver(config.cluster, config.task, config.rpc_layer)
    if config is not None and config.cluster.num_tasks("ps"):
        # Its workers would wait for the ps tasks to join their collectives, which they never do: a silent hang.
        raise ValueError(f"multi_worker_mirrored runs on a cluster of workers (and a chief); this TF_CONFIG has "
                         f"{config.cluster.num_tasks('ps')} ps task(s). Build 'parameter_server' for a cluster with "
                         "ps tasks, or start the job without them (tensorfleet launch without --ps). Received: "
                         f"cluster={ {role: len(addrs) for role, addrs in config.cluster.jobs.items()} }")
    impl = {
        CollectiveImplementation.AUTO: tf.distribute.experimental.CommunicationImplementation.AUTO,
        CollectiveImplementation.RING: tf.distribute.experimental.CommunicationImplementation.RING,
        CollectiveImplementation.NCCL: tf.distribute.experimental.CommunicationImplementation.NCCL,
    }[kind]
    options = tf.distribute.experimental.CommunicationOptions(implementation=impl, timeout_seconds=timeout_seconds)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)
    _mend_keras3_fit()  # Keras 3's own fit fails under this strategy (keras-team/keras#20585)
    attach_compression(strategy, compression)
    return strategy


def _cluster_resolver(cluster: ClusterSpec, task: Task | None, rpc_layer: str | None = None) -> Any:
    import tensorflow as tf

    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster.to_tf(), task_type=task.role if task else None, task_id=task.index if task else None,
        rpc_layer=rpc_layer or "grpc",
    )


# --------------------------------------------------------------------------- parameter server


def parameter_server(*, cluster: ClusterSpec | dict[str, Any] | None = None,
                     max_shards: int | None = None, min_shard_bytes: int | None = None,
                     staleness: int | str | None = None, serve: bool = True) -> Any:
    """``ParameterServerStrategy``: workers train asynchronously against variables on ps tasks.

    The cluster comes from ``cluster`` (a :class:`ClusterSpec`, e.g. from
    :func:`~tensorfleet.strategies.servers.start_in_process_cluster`) or from TF_CONFIG. When
    TF_CONFIG says this process is a ``worker`` or ``ps`` task and ``serve`` is true, its server
    is started and this call blocks serving it, as those tasks only serve; only the chief (the
    coordinator) gets a strategy back.

    Args:
        cluster: the cluster; default TF_CONFIG.
        max_shards: split each variable into at most this many shards across the ps tasks
            (``tf.distribute.experimental.partitioners.MinSizePartitioner``).
        min_shard_bytes: smallest shard, in bytes (default 256 KiB when max_shards is set).
        staleness: the consistency model (:mod:`tensorfleet.strategies.staleness`): k >= 0 is
            stale-synchronous (SSP), a worker runs at most k steps ahead of the slowest; 0 keeps
            the workers in lockstep, though each worker's update is still applied on its own (no
            mode here aggregates them: that is multi_worker_mirrored); None (TensorFlow's
            behaviour) is fully asynchronous. Worker failures are handled as TensorFlow does
            under every setting: the lost step runs again, at least once.
        serve: on worker/ps tasks, start the server and block.

    Example (the coordinator of a cluster in this process; it cannot run inside the test
    suite, where connecting to a cluster would change the process's eager context for good):
        >>> from tensorfleet.strategies.servers import start_in_process_cluster
        >>> spec = start_in_process_cluster(workers=2, ps=1)  # doctest: +SKIP
        >>> strategy = parameter_server(cluster=spec, staleness=2)  # doctest: +SKIP

    Bad options fail before anything starts:
        >>> parameter_server(min_shard_bytes=1024)
        Traceback (most recent call last):
        ...
        ValueError: min_shard_bytes only applies with max_shards. Received: min_shard_bytes=1024, max_shards=None
    """
    import tensorflow as tf

    resolve_staleness(staleness)  # a bad value fails before anything starts
    integer("max_shards", max_shards, minimum=1, optional=True)
    integer("min_shard_bytes", min_shard_bytes, minimum=1, optional=True)
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
    strategy = tf.distribute.experimental.ParameterServerStrategy(_cluster_resolver(spec, task),
                                                                  variable_partitioner=partitioner)
    attach(strategy, staleness)
    return strategy


# --------------------------------------------------------------------------- availability


def _check_mirrored() -> Availability:
    n = len(local_devices())
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


register("one_device", one_device, aliases=("single", "default"),
         description="OneDeviceStrategy: everything on one device.")
register("mirrored", mirrored, aliases=("mirror",), check=_check_mirrored,
         description="MirroredStrategy: synchronous data parallelism over this machine's devices.")
register("multi_worker_mirrored", multi_worker_mirrored, aliases=("mwms", "multi_worker"),
         check=_check_multi_worker,
         description="MultiWorkerMirroredStrategy: synchronous all-reduce across TF_CONFIG workers.")
register("parameter_server", parameter_server, aliases=("ps",), check=_check_parameter_server,
         description="ParameterServerStrategy: variables on ps tasks; workers asynchronous, or at most "
                     "staleness=k steps apart (SSP, k=0 lockstep).")
register("central_storage", central_storage, aliases=("central",),
         description="CentralStorageStrategy: variables on one device, compute mirrored.")
