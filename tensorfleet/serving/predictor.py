"""What both fronts call: find the servable, check the request, run it (batched or not).

:meth:`Predictor.submit` checks a request at once (raising
:class:`~tensorfleet.serving.errors.ServingError`) and returns a future of the outputs, which the
REST front awaits on its event loop and the gRPC front waits on in its handler thread. With
batching, the future is a batcher's; without, one signature call on a small thread pool.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from tensorfleet.serving.batching import Batcher, BatchingOptions, Done
from tensorfleet.serving.elastic import Autoscaler
from tensorfleet.serving.errors import Code, ServingError
from tensorfleet.serving.metrics import ServingMetrics
from tensorfleet.serving.options import ScalingOptions, StageOptions
from tensorfleet.serving.replicas import ReplicaPool
from tensorfleet.serving.repository import ModelRepository
from tensorfleet.serving.servable import Servable, Signature
from tensorfleet.serving.stages import StagedRunner
from tensorfleet.serving.standby import StandbySupply
from tensorfleet.validation import positive_int

__all__ = ["Prediction", "Predictor"]


@dataclass
class Prediction:
    """A request accepted for running: where it runs and the future of its outputs (None when
    :meth:`Predictor.submit` was given a ``done`` callable instead)."""

    servable: Servable
    signature: Signature
    outputs: list[str]
    future: Future | None

    def result(self, timeout: float | None = None) -> dict[str, np.ndarray]:
        """The requested outputs, once computed (``output_filter`` applied)."""
        if self.future is None:
            raise ValueError("This prediction was submitted with a done callable; its outcome goes there.")
        values = self.future.result(timeout)
        return {k: values[k] for k in self.outputs}


def _outcome(future: Future) -> dict | BaseException:
    """A done future's result, or its exception (a cancelled one: the server is stopping)."""
    if future.cancelled():
        return ServingError("The request was cancelled: the server is stopping.", Code.UNAVAILABLE)
    return future.exception() or future.result()


class Predictor:
    """Runs requests against a :class:`~tensorfleet.serving.repository.ModelRepository`.

    Example:
        >>> predictor = Predictor(repository, batching=BatchingOptions(max_batch_size=32))  # doctest: +SKIP
        >>> predictor.submit("digits", {"image": x}).result()["logits"]                       # doctest: +SKIP
    """

    def __init__(self, repository: ModelRepository, *, batching: BatchingOptions | None = None,
                 request_threads: int = 4, scaling: ScalingOptions | None = None, stages: StageOptions | None = None,
                 standby: StandbySupply | None = None) -> None:
        scaling, staging = scaling or ScalingOptions(), stages or StageOptions()
        self.repository = repository
        # elastic serving starts at min_replicas; at 0 (scale to zero) a request starts the first
        # replica on a standby process (TensorFlow imported, shared by the server's models)
        elastic = scaling.elastic
        self.min_replicas, self.max_replicas = scaling.bounds
        self.replicas = self.min_replicas
        self.replicated = elastic or scaling.replicas > 0
        self._own_standby = standby is None and self.min_replicas == 0 and self.replicated
        self.standby = StandbySupply() if self._own_standby else standby
        self.idle_timeout = scaling.idle_timeout
        self.target_wait = scaling.target_ms / 1e3
        self.stages, self.micro_batches = staging.stages, staging.micro_batches
        if staging.devices and self.stages < 2:
            raise ValueError(f"Stage devices place the stages of --stages K (K >= 2). Received: stages={self.stages}, "
                             f"stage_devices={list(staging.devices)}")
        self.stage_devices = list(staging.devices or [])
        if self.stages > 1 and self.replicated:
            raise ValueError(f"Serve either stages or replicas, not both. Received: stages={self.stages}, "
                             f"replicas={self.max_replicas}")
        if batching is not None and batching.num_batch_threads < self.max_replicas:  # keep every replica busy
            batching = dataclasses.replace(batching, num_batch_threads=self.max_replicas)
        self.batching = batching
        threads = max(positive_int("request_threads", request_threads), self.max_replicas)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tfl-serving")
        self._batchers: dict[tuple[int, str], Batcher] = {}
        self.pools: dict[int, ReplicaPool] = {}
        self.autoscalers: dict[int, Autoscaler] = {}
        self.staged: dict[int, StagedRunner] = {}
        self._inflight: dict[int, int] = {}
        self._retired: set[int] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self.metrics = ServingMetrics(repository.name, queue_depth=self.queue_depth, in_flight=self.in_flight,
                                      pools=lambda: dict(self.pools))

    @property
    def ready(self) -> bool:
        """True while a version is loaded and the server is not shutting down."""
        return not self._closed and bool(self.repository.versions)

    def in_flight(self) -> int:
        """Requests accepted and not yet answered, over every version."""
        with self._lock:
            return sum(self._inflight.values())

    def queue_depth(self) -> int:
        with self._lock:
            return sum(b.queue_depth for b in self._batchers.values())

    def submit(self, model: str, inputs: Mapping[str, Any], *, version: int | None = None, label: str | None = None,
               signature_name: str | None = None, output_filter: list[str] | None = None,
               strict_dtype: bool = False, servable: Servable | None = None,
               done: Done | None = None) -> Prediction:
        """Checks the request and starts it; every problem with it raises ServingError here.

        ``servable``, when given, is the version already picked for the request (REST reads the
        signature's input names from it). A request not pinned to a version that picked one just
        unloaded goes to the version that replaced it. ``done``, when given, is called with the
        signature's outputs (all of them; ``output_filter`` is the caller's to apply, as
        :meth:`Prediction.result` does) or the exception, on the thread that ran the request,
        after the request is counted out, and the prediction has no future: what the REST front
        uses, a future and its callbacks cost more per request.
        """
        pinned = version is not None or label is not None
        for _ in range(3):
            servable = servable or self.repository.get(model, version, label)
            signature = servable.signature(signature_name)
            outputs = signature.filter_outputs(output_filter)
            arrays = signature.check(inputs, strict_dtype=strict_dtype)
            if self._reserve(servable.version):
                break
            if pinned:
                raise ServingError(f"Servable not found for request: Specific({model}, {servable.version}) was "
                                   "just unloaded.", Code.NOT_FOUND)
            servable = None
        else:
            raise ServingError(f"The versions of {model!r} are changing too fast; retry.", Code.UNAVAILABLE)
        version_run = servable.version
        future: Future | None
        finished = None
        if done is not None:
            def finished(outcome: dict | BaseException) -> None:
                self._count(version_run, -1)
                done(outcome)
        try:
            if self.batching is None:
                future = self._pool.submit(self._runner(servable), signature.name, arrays)
            else:
                future = self._batcher(servable, signature.name).submit(arrays, finished)
        except BaseException:
            self._count(version_run, -1)
            raise
        if future is not None and finished is None:
            future.add_done_callback(lambda _: self._count(version_run, -1))
        elif future is not None:  # one signature call per request, on the pool: its future tells ``done``
            future.add_done_callback(lambda f: finished(_outcome(f)))
            future = None
        return Prediction(servable, signature, outputs, future)

    def _reserve(self, version: int) -> bool:
        """Counts a request in flight on ``version``, unless that version is being unloaded."""
        with self._lock:
            if self._closed:
                raise ServingError("The server is shutting down.", Code.UNAVAILABLE)
            if version in self._retired:
                return False
            self._inflight[version] = self._inflight.get(version, 0) + 1
            return True

    def _count(self, version: int, delta: int) -> None:
        with self._idle:
            self._inflight[version] = self._inflight.get(version, 0) + delta
            if not self._inflight[version]:
                self._idle.notify_all()

    def _batcher(self, servable: Servable, signature: str) -> Batcher:
        key = (servable.version, signature)
        batcher = self._batchers.get(key)  # found without the lock (one dict read); made under it
        if batcher is not None:
            return batcher
        with self._lock:
            if key not in self._batchers:
                assert self.batching is not None  # only a batching predictor asks for its batchers
                run = self._runner(servable)
                self._batchers[key] = Batcher(lambda arrays: run(signature, arrays), self.batching,
                                              name=f"batch-{servable.name}-{servable.version}")
            return self._batchers[key]

    def _runner(self, servable: Servable) -> Callable[..., dict[str, np.ndarray]]:
        pool = self.pools.get(servable.version) or self.staged.get(servable.version)
        run = servable.run if pool is None else pool.run

        def observed(signature: str | None, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.metrics.observe_batch(next(iter(arrays.values())).shape[0])
            return run(signature, arrays)

        return observed

    def start_replicas(self, log: Callable[[str], None] | None = None) -> None:
        """Starts the stage threads or ``replicas`` worker processes of every loaded version (if any)."""
        for servable in list(self.repository.servables.values()):
            self.prepare(servable, log)

    def prepare(self, servable: Servable, log: Callable[[str], None] | None = None) -> None:
        """Gets a version ready before it is routed to: its stage threads, or its replica processes
        (and their autoscaler, when ``max_replicas`` is above ``replicas``), if any."""
        if self.stages > 1 and servable.version not in self.staged:
            self.staged[servable.version] = StagedRunner(servable, self.stages, micro_batches=self.micro_batches,
                                                         devices=self.stage_devices)
        if self.replicated and servable.version not in self.pools:
            pool = ReplicaPool(servable.name, servable.version, servable.path, replicas=self.replicas,
                               intra_op_threads=1,
                               standby=self.standby if self.min_replicas == 0 else None, log=log)
            self.pools[servable.version] = pool
            if self.max_replicas > self.min_replicas:
                self.autoscalers[servable.version] = Autoscaler(
                    pool, min_replicas=self.min_replicas, max_replicas=self.max_replicas, target_wait=self.target_wait,
                    idle_timeout=self.idle_timeout, log=log).start()

    def retire(self, version: int, timeout: float = 30.0) -> bool:
        """After ``version`` stopped being routed to: waits for its requests in flight (up to
        ``timeout``), then stops its batchers and replicas. True if it drained in time."""
        with self._idle:
            self._retired.add(version)
            drained = self._idle.wait_for(lambda: not self._inflight.get(version), timeout)
            batchers = [b for (v, _), b in self._batchers.items() if v == version]
            self._batchers = {k: b for k, b in self._batchers.items() if k[0] != version}
        for batcher in batchers:
            batcher.close()
        scaler = self.autoscalers.pop(version, None)
        if scaler is not None:
            scaler.stop()
        staged = self.staged.pop(version, None)
        if staged is not None:
            staged.close()
        pool = self.pools.pop(version, None)
        if pool is not None:
            pool.close()
        return drained

    @property
    def batches(self) -> int:
        """Batches run so far, over every batcher."""
        with self._lock:
            return sum(b.batches for b in self._batchers.values())

    def close(self) -> None:
        """Runs what is queued, then stops the batchers and the request threads."""
        self._closed = True
        with self._lock:
            batchers = list(self._batchers.values())
        for batcher in batchers:
            batcher.close()
        self._pool.shutdown(wait=True)
        for scaler in self.autoscalers.values():
            scaler.stop()
        runners: list[ReplicaPool | StagedRunner] = [*self.pools.values(), *self.staged.values()]
        for runner in runners:
            runner.close()
        if self._own_standby and self.standby is not None:
            self.standby.close()
