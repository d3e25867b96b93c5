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
  the workers left; when none is left, ``AllWorkersLostError`` stops the run. The round's
  input is the state after the last completed round, so no completed round is lost. A dead
  worker is noticed at once (its connection fails); a frozen one (stopped, cut off) when a
  round has run ``round_timeout`` seconds and it does not answer a short question;
* before the first round every worker is checked: ``WorkerUnreachableError`` for an
  address where nothing answers, ``WorkerVersionError`` for a gRPC server that is not a TFF
  worker of the installed version, both naming the worker
  (:mod:`~tensorfleet.federated.backends.addresses`).

Every step is recorded as a :class:`WorkerEvent` in ``DistributedContext.events``. The TFF
executor plumbing is in :mod:`~tensorfleet.federated.backends.remote_executors`.

Example (one FedAvg round of four clients on two workers started here, stopped after):
    >>> import numpy as np
    >>> import tensorflow as tf
    >>> import tensorflow_federated as tff
    >>> from tensorfleet.federated.backends.remote import installed
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
    ...     with installed([a.address, b.address]) as ctx:
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

import concurrent.futures
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from tensorfleet.federated.backends.addresses import (
    AllWorkersLostError,
    WorkerAddress,
    WorkerLostError,
    parse_addresses,
)
from tensorfleet.federated.backends.remote_executors import (
    WorkerConnection,
    abandon,
    mergeable_context,
    probe,
    sync_context,
)
from tensorfleet.validation import integer, number

__all__ = ["DistributedContext", "WorkerEvent", "install_default", "installed"]

_LOG = logging.getLogger(__name__)


@dataclass
class WorkerEvent:
    """One thing that happened to a distributed context (for logs and tests)."""

    kind: str  # "invoke", "dispatch", "worker_lost", "retry"
    address: str = ""
    attempt: int = 0
    detail: str = ""
    time: float = field(default_factory=time.monotonic)


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
        self.num_subrounds = integer("num_subrounds", num_subrounds, minimum=1, optional=True) or len(addresses)
        self.connect_timeout = number("connect_timeout", connect_timeout, above=0)
        self.lost_timeout = number("lost_timeout", lost_timeout, above=0)
        self.round_timeout = number("round_timeout", round_timeout, above=0, optional=True)
        self.max_retries = integer("max_retries", max_retries, minimum=0, optional=True)
        if self.max_retries is None:
            self.max_retries = len(addresses)
        self._workers = [WorkerConnection(a) for a in addresses]
        self._lock = threading.RLock()
        self._mergeable: Any = None
        self._context_stack_context: Any = None
        self.retries = 0
        self.events: list[WorkerEvent] = []
        self.listeners: list[Callable[[WorkerEvent], None]] = []
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
            probe(w, self.connect_timeout)

    def _emit(self, kind: str, address: str = "", detail: str = "") -> None:
        event = WorkerEvent(kind, address, self.retries, detail)
        self.events.append(event)
        for listener in list(self.listeners):
            listener(event)

    def _mark_lost(self, worker: WorkerConnection, reason: str) -> None:
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
        alive = [w for w in self._workers if not w.lost]
        for w in alive:
            if w.channel is None:  # closed by stop(); a later run reconnects
                w.connect()
        if not alive:
            detail = "; ".join(f"{w.address}: {w.reason}" for w in self._workers)
            raise AllWorkersLostError(
                f"All {len(self._workers)} TFF workers are lost ({detail}); the run stops here. Completed rounds "
                f"are kept (and in the last checkpoint); start workers and run again to go on.")
        return mergeable_context(alive, self.num_subrounds, lost_timeout=self.lost_timeout, on_lost=self._mark_lost,
                                 on_dispatch=lambda address, detail: self._emit("dispatch", address, detail))

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
                abandon(context)
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
            self._context_stack_context = sync_context(self.invoke)
        return self._context_stack_context

    def stop(self) -> None:
        """Closes the channels to the workers (they keep running; the next computation reconnects).

        When this is TFF's default context (:func:`install_default`), tensorfleet's own local
        runtime becomes the default again, so later computations do not go to these workers.
        """
        self.close()
        if self._context_stack_context is not None:
            import tensorflow_federated as tff

            from tensorfleet.federated.backends.tff import install_default as install_local_default

            if tff.framework.get_context_stack().current is self._context_stack_context:
                install_local_default()

    def close(self) -> None:
        with self._lock:
            if self._mergeable is not None:
                abandon(self._mergeable)
            self._mergeable = None
            for w in self._workers:
                w.close()

    def __repr__(self) -> str:
        return f"DistributedContext(alive={self.alive}, lost={self.lost}, num_subrounds={self.num_subrounds})"


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
