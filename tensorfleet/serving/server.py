"""The model server: a model's base directory served over TF Serving's gRPC and REST APIs.

:class:`ModelServer` loads the versions, starts the gRPC front (grpcio) and the REST front
(httptools on uvloop, :mod:`~tensorfleet.serving.http`) on 127.0.0.1 unless told otherwise, and
stops in order: both fronts stop listening and finish the requests in flight, then the batchers
run what is queued. :func:`serve` does the same
until SIGTERM or SIGINT, as ``tensorfleet serve`` does.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
from pathlib import Path
from typing import Callable, Mapping, Sequence

from tensorfleet.serving.batching import BatchingOptions
from tensorfleet.serving.grpc_api import GrpcServer
from tensorfleet.serving.predictor import Predictor
from tensorfleet.serving.repository import ModelRepository, VersionPolicy
from tensorfleet.serving.rest import RestServer
from tensorfleet.serving.stages import stage_devices as resolve_stage_devices
from tensorfleet.serving.versions import VersionWatcher
from tensorfleet.validation import integer, number, positive_int
from tensorfleet.validation import port as check_port

__all__ = ["ModelServer", "serve"]


class ModelServer:
    """One model served over gRPC (``port``) and REST (``rest_api_port``; 0 turns REST off).

    Args:
        base_path: the model's base directory (``BASE/<version>/saved_model.pb``).
        model_name: the name clients ask for (default: the base directory's name).
        host: the address both fronts bind; 127.0.0.1 unless another is asked for.
        port: gRPC port (TF Serving's 8500). rest_api_port: REST port (8501).
        batching: dynamic batching options; None runs one signature call per request.
        model_version_policy: ``latest`` (the highest version) or ``all``.
        labels: version labels (``{"stable": 1}``) for ``/labels/{label}`` and ``version_label``.
        max_request_bytes: the largest request body (REST, 413) or message (gRPC, RESOURCE_EXHAUSTED).
        drain_seconds: how long stopping waits for requests in flight.
        replicas: model replicas in worker processes (0: the model runs in this process); a replica
            that dies is restarted and its calls retried on another.
        max_replicas: above ``replicas``, replicas are added (up to this many) while requests wait
            for one longer than ``scale_target_ms`` and removed (down to ``replicas``) when idle;
            ``scale_plot`` is a PNG of the replica count and scale events written on stop.
        stages: above 1, requests run stage to stage through the version's ``stage_*`` signatures
            (export with ``stages=``), ``micro_batches`` of each request in flight; ``stage_devices``
            names the device of each stage (``["/cpu:0", "/cpu:1"]``; logical CPUs are made when
            TensorFlow's runtime has not started yet).
        poll_seconds: how often the base directory is checked for new versions (0: never).

    Example:
        >>> with ModelServer("models/digits", port=8500, rest_api_port=8501) as server:  # doctest: +SKIP
        ...     print(server.versions)
        [1]
    """

    def __init__(self, base_path: str | os.PathLike[str], *, model_name: str | None = None,
                 host: str = "127.0.0.1", port: int = 8500, rest_api_port: int = 8501,
                 batching: BatchingOptions | None = None, model_version_policy: str | VersionPolicy = "latest",
                 labels: Mapping[str, int] | None = None, max_request_bytes: int = 4 << 20,
                 drain_seconds: float = 10.0, request_threads: int = 4, replicas: int = 0,
                 max_replicas: int | None = None, scale_target_ms: float = 10.0, scale_plot: str | None = None,
                 stages: int = 1, micro_batches: int = 4, stage_devices: Sequence[str] | None = None,
                 poll_seconds: float = 1.0, log: Callable[[str], None] | None = None) -> None:
        self.base_path = Path(base_path)
        self.model_name = model_name or self.base_path.resolve().name
        self.host = host
        self.port = check_port("port", port)
        self.rest_api_port = integer("rest_api_port", rest_api_port, minimum=0, maximum=65535)
        self.max_request_bytes = positive_int("max_request_bytes", max_request_bytes)
        self.drain_seconds = number("drain_seconds", drain_seconds, minimum=0)
        self.poll_seconds = number("poll_seconds", poll_seconds, minimum=0)
        if stage_devices and positive_int("stages", stages) > 1:  # before loading starts TensorFlow's runtime
            stage_devices = resolve_stage_devices(stage_devices, stages)
        self.repository = ModelRepository(self.model_name, self.base_path, policy=model_version_policy,
                                          labels=labels)
        self.predictor = Predictor(self.repository, batching=batching, request_threads=request_threads,
                                   replicas=replicas, max_replicas=max_replicas, stages=stages,
                                   micro_batches=micro_batches, stage_devices=stage_devices,
                                   target_wait=number("scale_target_ms", scale_target_ms, above=0) / 1e3)
        self.scale_plot = scale_plot
        self.log = log or (lambda line: None)
        self._grpc: GrpcServer | None = None
        self._rest: RestServer | None = None
        self.watcher: VersionWatcher | None = None
        self._stopped = threading.Event()

    @property
    def versions(self) -> list[int]:
        return self.repository.versions

    def start(self) -> ModelServer:
        """Loads the model and starts both fronts; a port in use fails here, with nothing left running."""
        versions = self.repository.load()
        self.log(f"loaded {self.model_name!r} version(s) {versions} from {self.base_path}")
        try:
            self.predictor.start_replicas(self.log)
            if self.predictor.stages > 1:
                devices = [r.devices for r in self.predictor.staged.values()][:1]
                self.log(f"stages: {self.predictor.stages}, {self.predictor.micro_batches} micro-batches per request"
                         + (f", on {', '.join(devices[0])}" if devices and devices[0] else ""))
            if self.predictor.replicas:
                elastic = (f", elastic up to {self.predictor.max_replicas}"
                           if self.predictor.max_replicas > self.predictor.replicas else "")
                self.log(f"replicas: {self.predictor.replicas} worker processes per version{elastic}, pids "
                         f"{ {v: p.pids() for v, p in self.predictor.pools.items()} }")
            self._grpc = GrpcServer(self.predictor, self.host, self.port, max_message_bytes=self.max_request_bytes,
                                    drain_seconds=self.drain_seconds)
            self._grpc.start()
            self.log(f"gRPC  {self.host}:{self.port} (tensorflow.serving.PredictionService, ModelService)")
            if self.rest_api_port:
                self._rest = RestServer(self.predictor, self.host, self.rest_api_port,
                                        max_body_bytes=self.max_request_bytes, drain_seconds=self.drain_seconds)
                self._rest.start()
                self.log(f"REST  http://{self.host}:{self.rest_api_port}/v1/models/{self.model_name}")
            if self.poll_seconds:
                self.watcher = VersionWatcher(self.predictor, seconds=self.poll_seconds,
                                              drain_seconds=self.drain_seconds, log=self.log).start()
        except BaseException:
            self.stop()
            raise
        batching = self.predictor.batching
        self.log("batching: " + ("off (one signature call per request)" if batching is None else
                                  f"max_batch_size={batching.max_batch_size}, "
                                  f"batch_timeout_micros={batching.batch_timeout_micros}, "
                                  f"num_batch_threads={batching.num_batch_threads}, sizes={list(batching.sizes)}"))
        return self

    def stop(self) -> None:
        """Stops listening, finishes requests in flight (up to ``drain_seconds``), then the batchers."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.watcher is not None:
            self.watcher.stop()
        fronts = [f for f in (self._rest, self._grpc) if f is not None]
        threads = [threading.Thread(target=front.stop) for front in fronts]  # both drain at once
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        scalers = list(self.predictor.autoscalers.values())
        self.predictor.close()
        if self.scale_plot and scalers:
            self.log(f"scale events plotted to {scalers[-1].plot(self.scale_plot)}")

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until :meth:`stop` has been called (or ``timeout``); True if it was."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(base_path: str | os.PathLike[str], **options: object) -> None:
    """Runs a :class:`ModelServer` until SIGTERM or SIGINT, then drains it and returns.

    Takes :class:`ModelServer`'s arguments. Must run in the main thread (it installs the signal handlers).

    Example:
        >>> serve("models/digits", model_name="digits", port=8500, rest_api_port=8501)  # doctest: +SKIP
    """
    server = ModelServer(base_path, **options)  # type: ignore[arg-type]
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        # TensorFlow, Keras and the loaded model leave a few hundred thousand long-lived objects; a
        # full garbage collection walks all of them, holding the interpreter lock for 150-600 ms on
        # a 2-core machine, which every request in flight then waits out (the p99). Frozen, they are
        # no longer walked: what requests allocate is still collected.
        gc.collect()
        gc.freeze()
        while not stop.wait(0.5):
            pass
        server.log("stopping: draining requests in flight")
    finally:
        server.stop()
        server.log("stopped")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
