"""``tf.distribute``'s internals, where tensorfleet needs what TensorFlow does not expose.

Each function is one reach into a private part of TensorFlow's distribution code (or of Keras'
side-car evaluator, which sits beside it), named for what it gives and saying why the public API
does not give it. The rest of tensorfleet calls these and never touches the private names, so
when TensorFlow moves them this module is the one place to change. The names below exist alike
on TensorFlow 2.14 (the tff track) and 2.21 (the current track); nothing here branches on the
version yet.

* The parameter server's ``ClusterCoordinator``: its cluster (workers and closure queue), the
  queue's lock and state (the workers waiting on it), a closure's result, and a closure of one worker's own
  (:mod:`tensorfleet.strategies.staleness` gates the queue to enforce a staleness bound).
* ``ParameterServerStrategy``: whether Keras drives it through a coordinator, its worker count.
* ``MirroredStrategy``: a strategy whose collective keys no other strategy of the process uses.
* A strategy's cross-device ops (what ``cross_device_ops=`` chose).
* ``tf.data``'s test-only sleep transformation (a straggler's pause that burns no CPU).
* ``SidecarEvaluator``: its "no new checkpoint will come" hook and its 30 s wait for one.
* A ``tf.distribute.Server``'s own gRPC service: whether the worker process answers at all.

Example:
    >>> from tensorfleet.compat import distribute
    >>> distribute.uses_coordinator(object())
    False
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator

from tensorfleet.compat.keras import keras2

__all__ = ["closure_output", "closure_queue_lock", "condition_waiters", "coordinator_cluster", "cross_device_ops",
           "new_closure_queue", "new_mirrored_strategy", "parameter_server_workers", "queue_accepts_closures",
           "sidecar_checkpoint_wait", "sidecar_evaluator_class", "sleep_transformation", "tagged_work_waiting",
           "uses_coordinator", "worker_answers", "worker_closure", "workers_waiting_for_steps"]


# --------------------------------------------------------------------------- ClusterCoordinator


def _coordinator_module() -> Any:
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    return cluster_coordinator


def coordinator_cluster(coordinator: Any) -> Any:
    """The ``Cluster`` behind a ``ClusterCoordinator`` (its ``workers`` and ``closure_queue``), or None.

    The public coordinator schedules and joins; which workers it drives and the queue their
    threads take steps from are kept in its private ``_cluster``. The staleness gate wraps that
    queue, and tests read the workers to run a function on each.
    """
    return getattr(coordinator, "_cluster", None)


def new_closure_queue() -> Any:
    """An empty ``_CoordinatedClosureQueue``, the queue a ``ClusterCoordinator``'s workers take
    steps from: for testing the staleness gate on TensorFlow's own queue without a cluster."""
    return _coordinator_module()._CoordinatedClosureQueue()


def closure_queue_lock(queue: Any) -> Any:
    """The lock a closure queue holds while it changes state (``_queue_lock``).

    Workers the gate holds back wait on a condition of this lock, so that the queue's own
    notifications and the gate's are ordered with the queue's state.
    """
    return queue._queue_lock


def queue_accepts_closures(queue: Any) -> bool:
    """Whether the queue still hands out steps (``_should_process_closures``: false once the
    coordinator stops it, after an error or at shutdown); call with its lock held."""
    return bool(queue._should_process_closures)


def tagged_work_waiting(queue: Any, tag: Any) -> bool:
    """Whether work tagged for one worker alone (rebuilding its datasets after a failure) waits in
    the queue's ``_tagged_queue``; such work passes the gate at once. Call with the lock held."""
    tagged = queue._tagged_queue.get(tag)
    return tagged is not None and not tagged.empty()


def workers_waiting_for_steps(queue: Any) -> int:
    """How many worker threads wait in the queue's own ``get`` for a step (the waiters of its
    ``_closures_queued_condition``): a state one can wait for, where TensorFlow offers no event."""
    with queue._queue_lock:
        return condition_waiters(queue._closures_queued_condition)


def condition_waiters(condition: Any) -> int:
    """How many threads wait on a ``threading.Condition`` (its ``_waiters``); call with its lock held."""
    return len(condition._waiters)


def closure_output(closure: Any) -> Any:
    """The ``RemoteValue`` a scheduled step returns, or None once nobody holds it: a closure keeps
    it behind a weak reference (``_output_remote_value_ref``), the only way to reach it from a
    worker's thread."""
    reference = getattr(closure, "_output_remote_value_ref", None)
    return reference() if reference is not None else None


def worker_closure(fn: Callable[[], Any], cluster: Any) -> Any:
    """A ``ResourceClosure`` running ``fn`` (no arguments), to put in the queue tagged for one worker.

    The public API schedules on whichever worker is free; work for one given worker is what
    ``create_per_worker_dataset`` builds internally with this class.
    """
    return _coordinator_module().ResourceClosure(fn, cluster.resource_cancellation_mgr)


# --------------------------------------------------------------------------- strategies


def uses_coordinator(strategy: Any) -> bool:
    """Whether Keras drives ``strategy`` through a ``ClusterCoordinator`` (a parameter-server
    strategy): the flag Keras' own ``fit`` reads, ``_should_use_with_coordinator``."""
    return bool(getattr(strategy, "_should_use_with_coordinator", False))


def parameter_server_workers(strategy: Any) -> int:
    """The worker count of a ``ParameterServerStrategy`` (``_num_workers``): its cluster resolver
    knows it too, but the strategy's own count is the one its coordinator uses."""
    return int(strategy._num_workers)


def new_mirrored_strategy(devices: list[str], cross_device_ops: Any, *, collective_key_base: int) -> Any:
    """A ``MirroredStrategy`` over ``devices`` whose collective keys start at ``collective_key_base``.

    Every MirroredStrategy numbers its collective groups and instances from the same start, so a
    second one in the same process collides with the first. TensorFlow reads the base from the
    instance's ``_collective_key_base`` during ``__init__`` and has no argument for it, so the
    attribute is set between ``__new__`` and ``__init__``.
    """
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
    strategy._collective_key_base = collective_key_base
    strategy.__init__(devices=devices, cross_device_ops=cross_device_ops)
    return strategy


def cross_device_ops(strategy: Any) -> Any:
    """The cross-device ops a mirrored strategy reduces with (``extended._cross_device_ops``;
    None when TensorFlow chooses at the first reduction)."""
    return getattr(strategy.extended, "_cross_device_ops", None)


# --------------------------------------------------------------------------- tf.data


def sleep_transformation(microseconds: Any) -> Callable[[Any], Any]:
    """A ``Dataset.apply`` transformation that pauses ``microseconds`` before each element.

    Only ``tensorflow.python.data.experimental.ops.testing`` has it; a straggler's pause must be
    an op inside the step on the worker (a Python sleep would run once, at tracing) that does
    not burn the CPU the other workers share.
    """
    from tensorflow.python.data.experimental.ops import testing

    return testing.sleep(microseconds)


# --------------------------------------------------------------------------- SidecarEvaluator


def sidecar_evaluator_class(stop: Callable[[], bool]) -> type:
    """``tf.keras.utils.SidecarEvaluator`` whose "no new checkpoint will come" hook is ``stop``.

    The evaluator asks its private ``_timeout_fn`` after waiting a while without a new checkpoint
    and stops when it returns True; the public class has no argument for it.
    """

    base: Any = keras2().utils.SidecarEvaluator  # a class of a module mypy does not follow

    class Sidecar(base):
        def _timeout_fn(self) -> bool:
            return bool(stop())

    return Sidecar


@contextlib.contextmanager
def sidecar_checkpoint_wait(seconds: int) -> Iterator[None]:
    """Makes ``SidecarEvaluator`` wait ``seconds`` instead of 30 without a new checkpoint before it
    asks its stop hook, while inside. Its module reads the wait from the private constant
    ``_CHECKPOINT_TIMEOUT_SEC`` when the loop starts; a release without it keeps its own wait."""

    module: Any = sys.modules[keras2().utils.SidecarEvaluator.__module__]  # its private constant is set here
    before = getattr(module, "_CHECKPOINT_TIMEOUT_SEC", None)
    if before is None:
        yield
        return
    module._CHECKPOINT_TIMEOUT_SEC = seconds
    try:
        yield
    finally:
        module._CHECKPOINT_TIMEOUT_SEC = before


# --------------------------------------------------------------------------- a worker's own gRPC service


def worker_answers(target: str, timeout: float) -> bool:
    """Whether the TensorFlow server at ``target`` (``host:port``) answers its ``WorkerService.GetStatus``
    within ``timeout`` seconds.

    A stopped (SIGSTOP) or hung worker process still accepts TCP connections (the kernel does), so only a
    real call tells it from a live one; TensorFlow has no public call with a deadline for it. The request
    is TensorFlow's empty ``GetStatusRequest`` (zero bytes on the wire); the answer (the worker's devices)
    is not read. The service and method names are TensorFlow's wire protocol (worker_service.proto).
    """
    import grpc

    with grpc.insecure_channel(target) as channel:
        try:
            channel.unary_unary("/tensorflow.WorkerService/GetStatus")(b"", timeout=timeout)
        except grpc.RpcError:
            return False
    return True
