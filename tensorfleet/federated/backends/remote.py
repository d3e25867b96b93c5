"""A round's clients split across several TFF C++ workers, with retry when a worker dies.

tensorflow-federated runs this, tensorfleet only wires it and watches the workers:

* every computation is compiled to TFF's mergeable form
  (``tff.backends.native.compile_to_mergeable_comp_form``): the part up to the aggregation runs
  on each worker with its share of the clients, the partial aggregates are merged, the rest
  runs once. TFF's ``MergeableCompExecutionContext`` drives it over one asynchronous execution
  context per worker, each talking to its worker through ``RemoteExecutor`` and
  ``RemoteExecutorGrpcStub``. Each worker's context runs on an event loop of its own, because
  ``RemoteExecutor`` makes blocking gRPC calls: on one shared loop the workers would take turns;
* a round is split into as many parts as there were workers at the start, whatever happens
  later, so a round run on fewer workers computes the same parts and merges the same partial
  sums (with two parts the merge is one addition, which does not depend on the order);
* a worker that stops answering during a round is dropped and the whole round is run again on
  the workers left; when none is left, :class:`AllWorkersLostError` stops the run. The round's
  input is the state after the last completed round, so no completed round is lost. A dead
  worker is noticed at once (its connection fails); a frozen one (stopped, cut off) when a
  round has run ``round_timeout`` seconds and it does not answer a short question;
* before the first round every worker is checked: :class:`WorkerUnreachableError` for an
  address where nothing answers, :class:`WorkerVersionError` for a gRPC server that is not a TFF
  worker of the installed version, both naming the worker.

Example (one FedAvg round of four clients on two workers started here, stopped after):
    >>> import numpy as np
    >>> import tensorflow as tf
    >>> import tensorflow_federated as tff
    >>> from tensorfleet.federated.backends import remote as distributed
    >>> from tensorfleet.federated.algorithms import build_process
    >>> from tensorfleet.federated.backends.worker import start_worker
    >>> def model_fn():
    ...     model = tf.keras.Sequential([tf.keras.layers.Dense(10, input_shape=(64,))])
    ...     return tff.learning.models.from_keras_model(
    ...         model, input_spec=(tf.TensorSpec([None, 64]), tf.TensorSpec([None], tf.int32)),
    ...         loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    >>> process = build_process("fedavg", model_fn)
    >>> x, y = np.ones((10, 64), np.float32), np.arange(10, dtype=np.int32)
    >>> client_datasets = [tf.data.Dataset.from_tensor_slices((x, y)).batch(5)] * 4
    >>> with start_worker() as a, start_worker() as b:
    ...     with distributed.installed([a.address, b.address]) as ctx:
    ...         state = process.initialize()
    ...         out = process.next(state, client_datasets)
    >>> int(out.metrics["client_work"]["train"]["num_examples"])
    40
    >>> ctx.lost
    []
    >>> len({e.address for e in ctx.events if e.kind == "dispatch"})   # both workers got clients
    2
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

__all__ = [
    "AllWorkersLostError", "DistributedContext", "Event", "WorkerAddress", "WorkerError", "WorkerLostError",
    "WorkerUnreachableError", "WorkerVersionError", "install_default", "installed", "parse_address",
    "parse_addresses",
]

_LOG = logging.getLogger(__name__)
_RETRY_CODES = ("UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED", "UNKNOWN", "INTERNAL", "ABORTED")


class WorkerError(RuntimeError):
    """Base of the errors about one worker; ``address`` names it."""

    def __init__(self, message: str, address: str = "") -> None:
        super().__init__(message)
        self.address = address


class WorkerUnreachableError(WorkerError):
    """Nothing answers as a gRPC server at the worker's address."""


class WorkerVersionError(WorkerError):
    """A gRPC server answers at the address, but not as a TFF worker of the installed version."""


class WorkerLostError(WorkerError):
    """A worker stopped answering while a computation ran on it."""


class AllWorkersLostError(RuntimeError):
    """Every worker of a distributed context is lost; the run cannot go on."""


@dataclass(frozen=True)
class WorkerAddress:
    """``host:port`` of one worker."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def target(self) -> str:
        """The gRPC target (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(address: Any) -> WorkerAddress:
    """Parses ``"host:port"`` (``"[::1]:port"`` for IPv6) into a :class:`WorkerAddress`.

    Example:
        >>> parse_address("127.0.0.1:8471")
        WorkerAddress(host='127.0.0.1', port=8471)
    """
    if isinstance(address, WorkerAddress):
        return address
    hint = "Worker addresses are HOST:PORT with a port in [1, 65535], e.g. '127.0.0.1:8471'."
    if not isinstance(address, str):
        raise TypeError(f"{hint} Received: {address!r} of type {type(address).__name__}")
    text = address.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        ok = bool(sep and rest.startswith(":"))
    else:
        host, sep, port_text = text.rpartition(":")
        ok = bool(sep) and ":" not in host
    if not ok or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{hint} Received: {address!r}")
    return WorkerAddress(host, int(port_text))


def parse_addresses(addresses: Any) -> list[WorkerAddress]:
    """Parses a list of addresses, or one comma-separated string; refuses empty lists and repeats."""
    if isinstance(addresses, str):
        addresses = [a for a in addresses.split(",") if a.strip()]
    if not isinstance(addresses, (list, tuple)) or not addresses:
        raise ValueError(f"workers must be a non-empty list of HOST:PORT addresses. Received: workers={addresses!r}")
    parsed = [parse_address(a) for a in addresses]
    seen: set[WorkerAddress] = set()
    for a in parsed:
        if a in seen:
            raise ValueError(f"workers must not repeat an address. Received: {str(a)!r} twice in workers={addresses!r}")
        seen.add(a)
    return parsed


@dataclass
class _RemoteWorker:
    """The client side of one worker: its channel and stub, and whether it is lost."""

    address: WorkerAddress
    channel: Any = None
    stub: Any = None
    lost: bool = False
    lost_at: float | None = None
    reason: str = ""

    def connect(self) -> None:
        import grpc
        from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

        from tensorfleet.federated.backends.tff import _GRPC_OPTIONS

        self.channel = grpc.insecure_channel(self.address.target, _GRPC_OPTIONS)
        self.stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(self.channel)

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
        from tensorflow_federated.proto.v0 import executor_pb2, executor_pb2_grpc

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


@dataclass
class Event:
    """One thing that happened to a distributed context (for logs and tests)."""

    kind: str  # "invoke", "dispatch", "worker_lost", "retry"
    address: str = ""
    attempt: int = 0
    detail: str = ""
    time: float = field(default_factory=time.monotonic)


def _probe(worker: _RemoteWorker, timeout: float) -> None:
    """Checks that ``worker`` answers as a TFF worker of the installed version."""
    import grpc
    import numpy as np
    import tensorflow_federated as tff
    from tensorflow_federated.python.core.impl.executors import remote_executor
    from tensorflow_federated.python.core.impl.types import computation_types, placements

    address = str(worker.address)
    if not worker.ready(timeout):
        raise WorkerUnreachableError(
            f"No TFF worker answers at {address} (waited {timeout:g} s): nothing listens there, or it is not a "
            f"gRPC server. Start one with `tensorfleet federated worker --port {worker.address.port}` on "
            f"{worker.address.host}, or fix the address.", address)

    async def roundtrip() -> Any:
        executor = remote_executor.RemoteExecutor(worker.stub)
        executor.set_cardinalities({placements.CLIENTS: 0})
        try:
            value = await executor.create_value(np.int32(1729), computation_types.TensorType(np.int32))
            return await value.compute()
        finally:
            executor.close()

    try:
        # In a thread of its own: a notebook's main thread already runs an event loop. The stub's
        # calls block, so the wait is bounded here, not inside the loop; a server that never
        # answers leaves that (daemon) thread waiting, not the caller or interpreter exit.
        result = _run_in_daemon_thread(roundtrip, max(timeout, 5.0))
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


def _run_in_daemon_thread(coro_fn: Callable[[], Any], timeout: float) -> Any:
    """``asyncio.run(coro_fn())`` in a daemon thread; its result, or TimeoutError after ``timeout``."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def target() -> None:
        try:
            future.set_result(asyncio.run(coro_fn()))
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            future.set_exception(err)

    threading.Thread(target=target, daemon=True, name="tff-worker-check").start()
    return future.result(timeout=timeout)


class DistributedContext:
    """A TFF synchronous context that splits each computation's clients across workers.

    Args:
        workers: ``host:port`` addresses of running TFF workers (``tensorfleet federated worker``).
        num_subrounds: parts a round's clients are split into; the number of workers by default.
            It stays fixed when workers are lost, so the result does not depend on how many are left.
        connect_timeout: seconds to wait for each worker when checking it.
        lost_timeout: seconds a worker may stay unreachable during a computation before it is
            dropped and the computation is run again on the others.
        max_retries: computations run again at most this many times in all (one per lost worker
            by default is enough; the limit stops a loop when workers keep failing).
        round_timeout: seconds after which a computation that has not ended checks its workers;
            one that does not answer within ``lost_timeout`` (stopped, frozen, cut off) is dropped
            and the computation runs again on the others; busy workers answer, and the wait goes
            on. None: no check (a frozen worker then blocks the run).
        check: check every worker (reachable, right TFF version) now.

    Example (a sum over four clients, split across two workers started here):
        >>> import numpy as np
        >>> import tensorflow_federated as tff
        >>> from tensorfleet.federated.backends.worker import start_worker
        >>> @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
        ... def total(values):
        ...     return tff.federated_sum(values)
        >>> with start_worker() as a, start_worker() as b:
        ...     ctx = DistributedContext([a.address, b.address])
        ...     with ctx.installed():
        ...         result = total([1, 2, 3, 4])
        ...     ctx.close()
        >>> int(result), ctx.alive == [a.address, b.address], ctx.lost
        (10, True, [])
    """

    def __init__(self, workers: Sequence[str | WorkerAddress] | str, *, num_subrounds: int | None = None,
                 connect_timeout: float = 10.0, lost_timeout: float = 3.0, max_retries: int | None = None,
                 round_timeout: float | None = 120.0, check: bool = True) -> None:
        addresses = parse_addresses(workers)
        if num_subrounds is not None and (not isinstance(num_subrounds, int) or num_subrounds < 1):
            raise ValueError(f"num_subrounds must be a positive integer. Received: num_subrounds={num_subrounds!r}")
        for name, value in (("connect_timeout", connect_timeout), ("lost_timeout", lost_timeout)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds. Received: {name}={value!r}")
        if round_timeout is not None and (not isinstance(round_timeout, (int, float)) or round_timeout <= 0):
            raise ValueError(f"round_timeout must be a positive number of seconds or None. "
                             f"Received: round_timeout={round_timeout!r}")
        self.round_timeout = None if round_timeout is None else float(round_timeout)
        self.num_subrounds = num_subrounds if num_subrounds is not None else len(addresses)
        self.connect_timeout = float(connect_timeout)
        self.lost_timeout = float(lost_timeout)
        self.max_retries = len(addresses) if max_retries is None else int(max_retries)
        self._workers = [_RemoteWorker(a) for a in addresses]
        self._lock = threading.RLock()
        self._mergeable: Any = None
        self._context_stack_context: Any = None
        self.retries = 0
        self.events: list[Event] = []
        self.listeners: list[Callable[[Event], None]] = []
        for w in self._workers:
            w.connect()
        if check:
            try:
                self.check()
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------------ workers
    @property
    def addresses(self) -> list[str]:
        return [str(w.address) for w in self._workers]

    @property
    def alive(self) -> list[str]:
        """Addresses of the workers still in use."""
        return [str(w.address) for w in self._workers if not w.lost]

    @property
    def lost(self) -> list[str]:
        """Addresses of the workers dropped after they stopped answering."""
        return [str(w.address) for w in self._workers if w.lost]

    def check(self) -> None:
        """Checks every worker: reachable, and a TFF worker of the installed version."""
        for w in self._workers:
            _probe(w, self.connect_timeout)

    def _emit(self, kind: str, address: str = "", detail: str = "") -> None:
        event = Event(kind, address, self.retries, detail)
        self.events.append(event)
        for listener in list(self.listeners):
            listener(event)

    def _mark_lost(self, worker: _RemoteWorker, reason: str) -> None:
        with self._lock:
            if worker.lost:
                return
            worker.lost = True
            worker.lost_at = time.monotonic()
            worker.reason = reason
            self._mergeable = None
        _LOG.warning("TFF worker %s is lost (%s); its clients go to the workers left: %s",
                     worker.address, reason, ", ".join(self.alive) or "none")
        self._emit("worker_lost", str(worker.address), reason)

    # ------------------------------------------------------------------ TFF contexts
    def _build(self) -> Any:
        from tensorflow_federated.python.core.backends.native import compiler, mergeable_comp_compiler
        from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
        from tensorflow_federated.python.core.impl.execution_contexts import (
            async_execution_context, mergeable_comp_execution_context)

        alive = [w for w in self._workers if not w.lost]
        for w in alive:
            if w.channel is None:  # closed by stop(); a later run reconnects
                w.connect()
        if not alive:
            detail = "; ".join(f"{w.address}: {w.reason}" for w in self._workers)
            raise AllWorkersLostError(
                f"All {len(self._workers)} TFF workers are lost ({detail}); the run stops here. Completed rounds "
                f"are kept (and in the last checkpoint); start workers and run again to go on.")
        contexts = [
            _OwnLoopContext(async_execution_context.AsyncExecutionContext(
                _executor_factory(w, self), compiler_fn=compiler.desugar_and_transform_to_native,
                transform_args=tensorflow_computation.transform_args,
                transform_result=tensorflow_computation.transform_result))
            for w in alive
        ]
        context = mergeable_comp_execution_context.MergeableCompExecutionContext(
            contexts, compiler_fn=mergeable_comp_compiler.compile_to_mergeable_comp_form,
            transform_args=tensorflow_computation.transform_args,
            transform_result=tensorflow_computation.transform_result,
            num_subrounds=self.num_subrounds)
        for runner in [getattr(context, "_async_runner", None), *(c.runner for c in contexts)]:
            loop = getattr(runner, "_event_loop", None)
            if loop is not None:
                loop.set_exception_handler(_quiet_lost_workers)
        context._tensorfleet_worker_contexts = contexts  # noqa: SLF001 - so _abandon reaches their loops
        return context

    def _context(self) -> Any:
        with self._lock:
            if self._mergeable is None:
                self._mergeable = self._build()
            return self._mergeable

    def invoke(self, comp: Any, arg: Any) -> Any:
        """Runs ``comp`` on the workers; runs it again on the workers left when one is lost."""
        while True:
            context = self._context()
            lost_before = set(self.lost)
            self._emit("invoke", detail=str(getattr(comp, "type_signature", "")))
            try:
                return self._watched(context, comp, arg)
            except Exception as err:  # noqa: BLE001 - only worker losses are retried, others re-raised
                for w in self._workers:
                    if not w.lost and not w.ready(self.lost_timeout):
                        self._mark_lost(w, f"stopped answering ({type(err).__name__})")
                lost_now = sorted(set(self.lost) - lost_before)
                if not lost_now:
                    raise
                _abandon(context)
                if not self.alive:
                    self._context()  # raises AllWorkersLostError naming every worker
                if self.retries >= self.max_retries:
                    raise AllWorkersLostError(
                        f"Gave up after {self.retries} retries; lost workers: {', '.join(self.lost)}.") from err
                self.retries += 1
                self._emit("retry", ", ".join(lost_now), f"{type(err).__name__}: {str(err)[:200]}")

    def _watched(self, context: Any, comp: Any, arg: Any) -> Any:
        """``context.invoke``, checking the workers every ``round_timeout`` seconds while it runs."""
        if self.round_timeout is None:
            return context.invoke(comp, arg)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def target() -> None:
            try:
                future.set_result(context.invoke(comp, arg))
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                future.set_exception(err)

        # A daemon thread: a frozen worker may keep it waiting after the round has moved on.
        threading.Thread(target=target, daemon=True, name="tff-round").start()
        while True:
            try:
                return future.result(timeout=self.round_timeout)
            except concurrent.futures.TimeoutError:
                silent = [w for w in self._workers if not w.lost and not w.answers(self.lost_timeout)]
                for w in silent:
                    self._mark_lost(w, f"did not answer within {self.lost_timeout:g} s after "
                                       f"{self.round_timeout:g} s of a computation")
                if silent:
                    raise WorkerLostError(f"TFF worker {silent[0].address} stopped answering.",
                                          str(silent[0].address)) from None

    # ------------------------------------------------------------------ install / close
    @contextlib.contextmanager
    def installed(self) -> Iterator["DistributedContext"]:
        """Makes this TFF's current context in the ``with`` block."""
        import tensorflow_federated as tff

        with tff.framework.get_context_stack().install(self.tff_context):
            yield self

    @property
    def tff_context(self) -> Any:
        """The object TFF's context stack holds (a ``SyncContext`` that forwards to this)."""
        if self._context_stack_context is None:
            self._context_stack_context = _as_sync_context(self)
        return self._context_stack_context

    def stop(self) -> None:
        """Closes the channels to the workers (they keep running; the next computation reconnects).

        When this is TFF's default context (:func:`install_default`), tensorfleet's own local
        runtime becomes the default again, so later computations do not go to these workers.
        """
        self.close()
        if self._context_stack_context is not None:
            import tensorflow_federated as tff

            from tensorfleet.federated.backends import tff as runtime

            if tff.framework.get_context_stack().current is self._context_stack_context:
                runtime.install_default()

    def close(self) -> None:
        with self._lock:
            if self._mergeable is not None:
                _abandon(self._mergeable)
            self._mergeable = None
            for w in self._workers:
                w.close()

    def __repr__(self) -> str:
        return f"DistributedContext(alive={self.alive}, lost={self.lost}, num_subrounds={self.num_subrounds})"


def _as_sync_context(owner: DistributedContext) -> Any:
    from tensorflow_federated.python.core.impl.context_stack import context_base

    class _Sync(context_base.SyncContext):
        def invoke(self, comp: Any, arg: Any) -> Any:
            return owner.invoke(comp, arg)

    return _Sync()


def _quiet_lost_workers(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Leaves out the failures of a round's other parts after a worker loss, already handled."""
    if isinstance(context.get("exception"), (WorkerError, asyncio.CancelledError)):
        _LOG.debug("after a worker loss: %s", context.get("message"))
        return
    loop.default_exception_handler(context)


def _OwnLoopContext(inner: Any) -> Any:  # noqa: N802 - builds a class deriving from TFF's lazily imported base
    from tensorflow_federated.python.common_libs import async_utils
    from tensorflow_federated.python.core.impl.context_stack import context_base

    class OwnLoopContext(context_base.AsyncContext):
        """Runs one worker's asynchronous context on an event loop (and thread) of its own.

        TFF's ``RemoteExecutor`` calls its gRPC stub synchronously inside coroutines, so on the
        mergeable context's single loop one worker's ``Compute`` would block every other worker's
        share: the parts of a round would run one after another instead of side by side.
        """

        def __init__(self) -> None:
            self.inner = inner
            self.runner = async_utils.AsyncThreadRunner()

        async def invoke(self, comp: Any, arg: Any) -> Any:
            return await self.runner.await_coro_and_return_result(self.inner.invoke(comp, arg))

    return OwnLoopContext()


def _abandon(context: Any) -> None:
    """Cancels what a failed mergeable context still runs (a surviving worker's share)."""
    runners = [getattr(context, "_async_runner", None)]
    runners += [c.runner for c in getattr(context, "_tensorfleet_worker_contexts", [])]
    for runner in runners:
        loop = getattr(runner, "_event_loop", None)
        if loop is None or loop.is_closed():
            continue

        def cancel_all(loop: asyncio.AbstractEventLoop = loop) -> None:
            for task in asyncio.all_tasks(loop):
                task.cancel()

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(cancel_all)
        # TFF's runner joins its thread when collected; a thread stuck on a frozen worker's call
        # would then block whoever collects it. Stop its loop without waiting instead.
        runner._finalizer = lambda loop, thread: loop.call_soon_threadsafe(loop.stop)  # noqa: SLF001


def _executor_factory(worker: _RemoteWorker, owner: DistributedContext) -> Any:
    from tensorflow_federated.python.core.impl.executors import executor_factory, remote_executor
    from tensorflow_federated.python.core.impl.types import placements

    class _Factory(executor_factory.ExecutorFactory):
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
            if not worker.ready(owner.lost_timeout):
                owner._mark_lost(worker, f"unreachable for {owner.lost_timeout:g} s")  # noqa: SLF001
                raise WorkerLostError(f"TFF worker {address} stopped answering.", address)
            cardinalities = dict(cardinalities)
            if cardinalities.get(placements.CLIENTS) is None:
                cardinalities[placements.CLIENTS] = 0
            key = tuple(sorted((str(k), v) for k, v in cardinalities.items()))
            executor = self._executors.get(key)
            if executor is None:
                executor = remote_executor.RemoteExecutor(worker.stub)
                executor.set_cardinalities(cardinalities)
                self._executors[key] = executor
            owner._emit("dispatch", address, str(cardinalities[placements.CLIENTS]))  # noqa: SLF001
            return executor

        def clean_up_executor(self, cardinalities: Any) -> None:
            for executor in self._executors.values():
                with contextlib.suppress(Exception):
                    executor.close()
            self._executors.clear()

    return _Factory()


@contextlib.contextmanager
def installed(workers: Sequence[str] | str, **options: Any) -> Iterator[DistributedContext]:
    """A :class:`DistributedContext` installed as TFF's context for the block, closed after.

    Example (on one worker started here):
        >>> import numpy as np
        >>> import tensorflow_federated as tff
        >>> from tensorfleet.federated.backends.worker import start_worker
        >>> @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
        ... def total(values):
        ...     return tff.federated_sum(values)
        >>> with start_worker() as worker, installed([worker.address]) as ctx:
        ...     result = total([1, 2, 3])
        >>> int(result), ctx.lost
        (6, [])
    """
    ctx = DistributedContext(workers, **options)
    try:
        with ctx.installed():
            yield ctx
    finally:
        ctx.close()


def install_default(workers: Sequence[str] | str, **options: Any) -> DistributedContext:
    """Makes a :class:`DistributedContext` on ``workers`` TFF's default context; returns it.

    :class:`~tensorfleet.federated.Simulation` does this for ``workers=[...]``; a later
    simulation without workers puts its own context back.

    Example (``stop()`` makes tensorfleet's own local runtime the default again):
        >>> import numpy as np
        >>> import tensorflow_federated as tff
        >>> from tensorfleet.federated.backends.worker import start_worker
        >>> @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
        ... def total(values):
        ...     return tff.federated_sum(values)
        >>> with start_worker() as a, start_worker() as b:
        ...     ctx = install_default([a.address, b.address])
        ...     result = total([1, 2, 3, 4])   # runs on the workers
        ...     ctx.stop()
        >>> int(result), tff.framework.get_context_stack().current is ctx.tff_context
        (10, False)
    """
    import tensorflow_federated as tff

    ctx = DistributedContext(workers, **options)
    tff.framework.set_default_context(ctx.tff_context)
    return ctx
