"""TFF's executor plumbing for remote workers, which :class:`~tensorfleet.federated.backends.remote.DistributedContext`
wires.

* :class:`WorkerConnection`: the client side of one worker (gRPC channel and stub), whether it
  answers, and whether it is lost; :func:`probe` checks that a worker is a TFF worker of the
  installed version;
* :func:`mergeable_context`: TFF's ``MergeableCompExecutionContext`` over one asynchronous
  context per worker, each on an event loop of its own (:func:`own_loop_context`), each handing
  out executors through :func:`executor_factory`, which turns a gone worker into
  :class:`~tensorfleet.federated.backends.addresses.WorkerLostError`;
* :func:`abandon` cancels what a failed context still runs; :func:`sync_context` is the object
  TFF's context stack holds.

Example (the connection to an address where nothing listens):
    >>> import portpicker
    >>> from tensorfleet.federated.backends.addresses import parse_address
    >>> connection = WorkerConnection(parse_address(f"127.0.0.1:{portpicker.pick_unused_port()}"))
    >>> connection.connect()
    >>> connection.ready(timeout=0.2), connection.answers(timeout=0.2)
    (False, False)
    >>> connection.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tensorfleet.federated.backends.addresses import (
    WorkerAddress,
    WorkerError,
    WorkerLostError,
    WorkerUnreachableError,
    WorkerVersionError,
)

__all__ = [
    "WorkerConnection", "abandon", "executor_factory", "mergeable_context", "own_loop_context", "probe",
    "quiet_lost_workers", "run_in_daemon_thread", "sync_context",
]

_LOG = logging.getLogger(__name__)


@dataclass
class WorkerConnection:
    """The client side of one worker: its channel and stub, and whether it is lost."""

    address: WorkerAddress
    channel: Any = None
    stub: Any = None
    lost: bool = False
    lost_at: float | None = None
    reason: str = ""

    def connect(self) -> None:
        import grpc

        from tensorfleet.compat.tff import executor_stub
        from tensorfleet.federated.backends.tff import GRPC_OPTIONS

        self.channel = grpc.insecure_channel(self.address.target, GRPC_OPTIONS)
        self.stub = executor_stub(self.channel)

    def ready(self, timeout: float) -> bool:
        import grpc

        if self.channel is None:
            return False
        future = grpc.channel_ready_future(self.channel)
        try:
            future.result(timeout=timeout)
            return True
        except grpc.FutureTimeoutError:
            future.cancel()  # stops its polling thread before the channel may be closed
            return False

    def answers(self, timeout: float) -> bool:
        """Whether the worker answers an RPC within ``timeout`` (a stopped or frozen one does not).

        Any reply counts, an error status too: only silence or an unreachable worker fails.
        """
        import grpc

        from tensorfleet.compat.tff import executor_protos

        executor_pb2, executor_pb2_grpc = executor_protos()
        if self.channel is None:
            return False
        stub = executor_pb2_grpc.ExecutorGroupStub(self.channel)
        try:
            reply = stub.GetExecutor(executor_pb2.GetExecutorRequest(), timeout=timeout)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else None
            return code not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
        with contextlib.suppress(grpc.RpcError):  # give back the executor the question made
            stub.DisposeExecutor(executor_pb2.DisposeExecutorRequest(executor=reply.executor), timeout=timeout)
        return True

    def close(self) -> None:
        from tensorfleet.federated.backends.tff import close_channel

        if self.channel is not None:
            close_channel(self.channel)
        self.channel = None
        self.stub = None


def probe(worker: WorkerConnection, timeout: float) -> None:
    """Checks that ``worker`` answers as a TFF worker of the installed version."""
    import grpc
    import numpy as np

    from tensorfleet.compat.tff import import_tff, remote_executor

    tff = import_tff("the remote TFF workers")

    address = str(worker.address)
    if not worker.ready(timeout):
        raise WorkerUnreachableError(
            f"No TFF worker answers at {address} (waited {timeout:g} s): nothing listens there, or it is not a "
            f"gRPC server. Start one with `tensorfleet federated worker --port {worker.address.port}` on "
            f"{worker.address.host}, or fix the address.", address)

    async def roundtrip() -> Any:
        executor = remote_executor(worker.stub, {tff.CLIENTS: 0})
        try:
            value = await executor.create_value(np.int32(1729), tff.TensorType(np.int32))
            return await value.compute()
        finally:
            executor.close()

    try:
        # In a thread of its own: a notebook's main thread already runs an event loop. The stub's
        # calls block, so the wait is bounded here, not inside the loop; a server that never
        # answers leaves that (daemon) thread waiting, not the caller or interpreter exit.
        result = run_in_daemon_thread(roundtrip, max(timeout, 5.0))
    except concurrent.futures.TimeoutError:
        raise WorkerVersionError(
            f"The server at {address} accepted a gRPC connection but did not answer a tensorflow-federated "
            f"{tff.__version__} request within {max(timeout, 5.0):g} s: is it a TFF worker of this version, and is "
            f"it not stopped or overloaded?", address) from None
    except Exception as err:  # noqa: BLE001 - any failure of the round trip is reported with the worker
        code = err.code().name if isinstance(err, grpc.RpcError) and hasattr(err, "code") else type(err).__name__
        cause = getattr(err, "__cause__", None)
        if isinstance(cause, grpc.RpcError) and hasattr(cause, "code"):
            code = cause.code().name
        details = err.details() if isinstance(err, grpc.RpcError) and hasattr(err, "details") else str(err)
        raise WorkerVersionError(
            f"The server at {address} answers gRPC but not as a tensorflow-federated {tff.__version__} worker "
            f"({code}: {str(details)[:200]}). It may be a worker of another TFF version or another service: run "
            f"the worker_binary of this TFF version there (`tensorfleet federated worker`).", address) from None
    if int(np.asarray(result)) != 1729:
        raise WorkerVersionError(
            f"The TFF worker at {address} returned {result!r} for the value 1729: it is not a tensorflow-federated "
            f"{tff.__version__} worker. Run the worker_binary of this TFF version there.", address)


def run_in_daemon_thread(coro_fn: Callable[[], Any], timeout: float) -> Any:
    """``asyncio.run(coro_fn())`` in a daemon thread; its result, or TimeoutError after ``timeout``."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def target() -> None:
        try:
            future.set_result(asyncio.run(coro_fn()))
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            future.set_exception(err)

    threading.Thread(target=target, daemon=True, name="tff-worker-check").start()
    return future.result(timeout=timeout)


def sync_context(invoke: Callable[[Any, Any], Any]) -> Any:
    """A TFF ``SyncContext`` whose ``invoke`` is ``invoke`` (what TFF's context stack holds)."""
    from tensorfleet.compat.tff import context_bases

    class _Sync(context_bases()[0]):  # type: ignore[misc]
        def invoke(self, comp: Any, arg: Any) -> Any:
            return invoke(comp, arg)

    return _Sync()


def quiet_lost_workers(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Leaves out the failures of a round's other parts after a worker loss, already handled."""
    if isinstance(context.get("exception"), (WorkerError, asyncio.CancelledError)):
        _LOG.debug("after a worker loss: %s", context.get("message"))
        return
    loop.default_exception_handler(context)


def own_loop_context(inner: Any) -> Any:
    """``inner`` (a TFF asynchronous context) run on an event loop and thread of its own."""
    from tensorfleet.compat.tff import async_thread_runner, context_bases

    class OwnLoopContext(context_bases()[1]):  # type: ignore[misc]
        """Runs one worker's asynchronous context on an event loop (and thread) of its own.

        TFF's ``RemoteExecutor`` calls its gRPC stub synchronously inside coroutines, so on the
        mergeable context's single loop one worker's ``Compute`` would block every other worker's
        share: the parts of a round would run one after another instead of side by side.
        """

        def __init__(self) -> None:
            self.inner = inner
            self.runner = async_thread_runner()

        async def invoke(self, comp: Any, arg: Any) -> Any:
            return await self.runner.await_coro_and_return_result(self.inner.invoke(comp, arg))

    return OwnLoopContext()


def abandon(context: Any) -> None:
    """Cancels what a failed mergeable context still runs (a surviving worker's share)."""
    from tensorfleet.compat.tff import context_runner, detach_runner, runner_loop

    runners = [context_runner(context)]
    runners += [c.runner for c in getattr(context, "tensorfleet_worker_contexts", [])]
    for runner in runners:
        loop = runner_loop(runner)
        if loop is None or loop.is_closed():
            continue

        def cancel_all(loop: asyncio.AbstractEventLoop = loop) -> None:
            for task in asyncio.all_tasks(loop):
                task.cancel()

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(cancel_all)
        # TFF's runner joins its thread when collected; a thread stuck on a frozen worker's call
        # would then block whoever collects it. Stop its loop without waiting instead.
        detach_runner(runner)


def executor_factory(worker: WorkerConnection, *, lost_timeout: float, on_lost: Callable[[WorkerConnection, str], None],
                     on_dispatch: Callable[[str, str], None]) -> Any:
    """TFF's executor factory for one worker; ``on_lost(worker, reason)`` when it is found gone,
    ``on_dispatch(address, number of clients)`` for each executor handed out."""
    from tensorfleet.compat.tff import executor_factory_base, import_tff, remote_executor

    tff = import_tff("the remote TFF workers")

    class _Factory(executor_factory_base()):  # type: ignore[misc]
        """Remote executors on one worker; refuses (not retryable) once the worker is gone.

        TFF's asynchronous context retries a ``RetryableError`` (a worker that is UNAVAILABLE)
        forever; checking the worker here turns a dead worker into :class:`WorkerLostError`.
        """

        def __init__(self) -> None:
            self._executors: dict[tuple[Any, ...], Any] = {}

        def create_executor(self, cardinalities: Any) -> Any:
            address = str(worker.address)
            if worker.lost or worker.stub is None:
                raise WorkerLostError(f"TFF worker {address} is lost.", address)
            if not worker.ready(lost_timeout):
                on_lost(worker, f"unreachable for {lost_timeout:g} s")
                raise WorkerLostError(f"TFF worker {address} stopped answering.", address)
            cardinalities = dict(cardinalities)
            if cardinalities.get(tff.CLIENTS) is None:
                cardinalities[tff.CLIENTS] = 0
            key = tuple(sorted((str(k), v) for k, v in cardinalities.items()))
            executor = self._executors.get(key)
            if executor is None:
                executor = remote_executor(worker.stub, cardinalities)
                self._executors[key] = executor
            on_dispatch(address, str(cardinalities[tff.CLIENTS]))
            return executor

        def clean_up_executor(self, cardinalities: Any) -> None:
            for executor in self._executors.values():
                with contextlib.suppress(Exception):
                    executor.close()
            self._executors.clear()

    return _Factory()


def mergeable_context(workers: Sequence[WorkerConnection], num_subrounds: int, *, lost_timeout: float,
                      on_lost: Callable[[WorkerConnection, str], None],
                      on_dispatch: Callable[[str, str], None]) -> Any:
    """TFF's mergeable context splitting each computation into ``num_subrounds`` parts over ``workers``."""
    from tensorfleet.compat.tff import async_execution_context, context_runner, mergeable_execution_context, runner_loop

    contexts = [
        own_loop_context(async_execution_context(
            executor_factory(w, lost_timeout=lost_timeout, on_lost=on_lost, on_dispatch=on_dispatch)))
        for w in workers
    ]
    context = mergeable_execution_context(contexts, num_subrounds)
    for runner in [context_runner(context), *(c.runner for c in contexts)]:
        loop = runner_loop(runner)
        if loop is not None:
            loop.set_exception_handler(quiet_lost_workers)
    context.tensorfleet_worker_contexts = contexts  # so abandon() reaches their loops
    return context
