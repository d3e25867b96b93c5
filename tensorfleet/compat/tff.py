"""tensorflow-federated: whether it can be imported here, and one clear error where it cannot.

TFF's last releases (0.87-0.89) pin TensorFlow 2.14 and Python < 3.12, so it lives on the tff track
only (``make install-tff``). Only the ``tff`` federated backend, the remote TFF workers and the
adapter that accepts a TFF ClientData import it.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

__all__ = [
    "TFF_TRACK_HINT", "TffUnavailableError", "async_execution_context", "async_thread_runner", "close_channel",
    "context_bases", "context_runner", "detach_runner", "executor_factory_base", "executor_protos", "executor_stub",
    "import_tff", "mergeable_execution_context", "remote_executor", "runner_loop",
    "sync_execution_context", "tff_available",
]

TFF_TRACK_HINT = ("tensorflow-federated pins TensorFlow 2.14 and Python 3.11: use the tff track "
                  "(`make install-tff`, then `.venv-tff/bin/python`), or the compiled backend (backend='compiled'), "
                  "which needs no TFF")


class TffUnavailableError(ImportError):
    """tensorflow-federated is needed for what was asked but cannot be imported in this environment."""


@functools.lru_cache(maxsize=None)
def tff_available() -> bool:
    """True when ``import tensorflow_federated`` would work (found and importable with this TensorFlow)."""
    if importlib.util.find_spec("tensorflow_federated") is None:
        return False
    try:
        import tensorflow_federated  # noqa: F401
    except Exception:  # any import failure (TFF 0.87 on TensorFlow 2.21 fails deep in its imports)
        return False
    return True


def import_tff(what: str) -> Any:
    """``tensorflow_federated``, or :class:`TffUnavailableError` saying that ``what`` needs it and how to get it."""
    try:
        import tensorflow_federated as tff
    except Exception as error:
        raise TffUnavailableError(f"{what} needs tensorflow-federated, which cannot be imported here "
                                  f"({type(error).__name__}: {error}). {TFF_TRACK_HINT}.") from error
    return tff


# ---------------------------------------------------------------------------------------------------------------
# TFF's private executor plumbing. tensorfleet owns TFF's C++ worker process (TFF's own local context
# orphans it at exit) and splits rounds across remote workers; TFF 0.87 exposes neither the gRPC
# stub, the remote executor nor the execution contexts publicly, so they are reached here, by name.


def executor_stub(channel: Any) -> Any:
    """TFF's gRPC stub of a remote executor over ``channel`` (``RemoteExecutorGrpcStub``; has ``is_ready``).

    Needed to talk to a ``worker_binary`` tensorfleet started itself (TFF only makes stubs inside its
    own contexts)."""
    from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

    return remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)


def remote_executor(stub: Any, cardinalities: Any) -> Any:
    """TFF's ``RemoteExecutor`` on ``stub`` with ``cardinalities`` set: the executor a context hands out
    for one of tensorfleet's workers."""
    from tensorflow_federated.python.core.impl.executors import remote_executor as remote

    executor = remote.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor


def executor_factory_base() -> type:
    """TFF's ``ExecutorFactory`` base class, which a context asks for executors (subclassed to hand out
    executors on tensorfleet's own workers, and to notice a lost one)."""
    from tensorflow_federated.python.core.impl.executors import executor_factory

    return executor_factory.ExecutorFactory


def context_bases() -> tuple[type, type]:
    """``(SyncContext, AsyncContext)``: TFF's context base classes, for the contexts tensorfleet puts on
    TFF's context stack (one that runs a worker's share on an event loop of its own)."""
    from tensorflow_federated.python.core.impl.context_stack import context_base

    return context_base.SyncContext, context_base.AsyncContext


def async_thread_runner() -> Any:
    """TFF's ``AsyncThreadRunner``: an event loop on a thread of its own."""
    from tensorflow_federated.python.common_libs import async_utils

    return async_utils.AsyncThreadRunner()


def _native_args() -> dict[str, Any]:
    from tensorflow_federated.python.core.backends.native import compiler
    from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation

    return dict(compiler_fn=compiler.desugar_and_transform_to_native,
                transform_args=tensorflow_computation.transform_args,
                transform_result=tensorflow_computation.transform_result)


def sync_execution_context(executor_fn: Any) -> Any:
    """TFF's synchronous execution context with the native compiler over ``executor_fn`` (what TFF's
    own ``set_sync_local_cpp_execution_context`` builds, on an executor factory of tensorfleet's)."""
    from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context as sync

    return sync.SyncExecutionContext(executor_fn=executor_fn, **_native_args())


def async_execution_context(executor_fn: Any) -> Any:
    """TFF's asynchronous execution context with the native compiler over ``executor_fn``."""
    from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context as context

    return context.AsyncExecutionContext(executor_fn, **_native_args())


def mergeable_execution_context(contexts: Any, num_subrounds: int) -> Any:
    """TFF's ``MergeableCompExecutionContext`` splitting each computation into ``num_subrounds`` parts
    over ``contexts`` (one per worker)."""
    from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
    from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context as mergeable

    args = _native_args()
    return mergeable.MergeableCompExecutionContext(
        contexts, compiler_fn=mergeable_comp_compiler.compile_to_mergeable_comp_form,
        transform_args=args["transform_args"], transform_result=args["transform_result"],
        num_subrounds=num_subrounds)


def executor_protos() -> tuple[Any, Any]:
    """``(executor_pb2, executor_pb2_grpc)``: TFF's executor service messages and stub, to ask a worker
    for an executor (whether it answers at all) without running a computation."""
    from tensorflow_federated.proto.v0 import executor_pb2, executor_pb2_grpc

    return executor_pb2, executor_pb2_grpc


def context_runner(context: Any) -> Any:
    """The ``AsyncThreadRunner`` of a TFF mergeable context (None when it has none): where its own
    coroutines run, to cancel them when a worker is lost."""
    return getattr(context, "_async_runner", None)


def runner_loop(runner: Any) -> Any:
    """The event loop of a TFF ``AsyncThreadRunner`` (None when it has none)."""
    return getattr(runner, "_event_loop", None)


def detach_runner(runner: Any) -> None:
    """Makes collecting ``runner`` stop its loop without joining its thread.

    TFF's runner joins its thread when it is collected; a thread stuck on a frozen worker's call
    would then block whoever collects it."""
    runner._finalizer = lambda loop, thread: loop.call_soon_threadsafe(loop.stop)  # noqa: SLF001


def close_channel(channel: Any) -> None:
    """Closes a gRPC channel (of a TFF stub) once its connectivity polling thread has stopped.

    grpcio's polling thread (started by ``subscribe``, which TFF's stub and
    ``channel_ready_future`` use) can call into a channel closed under it and die with
    "Cannot invoke RPC: Channel closed!"; dropping the subscriptions first (grpc keeps them in the
    channel's private ``_connectivity_state``) and waiting for the thread to notice (at most two 0.2 s
    polls) avoids that.
    """
    import contextlib
    import time

    state = getattr(channel, "_connectivity_state", None)
    if state is not None:
        with contextlib.suppress(Exception):
            with state.lock:
                del state.callbacks_and_connectivities[:]
            deadline = time.monotonic() + 1.0
            while getattr(state, "polling", False) and time.monotonic() < deadline:
                time.sleep(0.02)
    with contextlib.suppress(Exception):
        channel.close()
