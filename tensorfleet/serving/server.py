"""The model server: a model's base directory, or the models of a config file, over TF Serving's gRPC and REST APIs.

:class:`ModelServer` loads the versions, starts the gRPC front (grpcio) and the REST front
(httptools on uvloop, :mod:`~tensorfleet.serving.http`) on 127.0.0.1 unless told otherwise, and
stops in order: both fronts stop listening and finish the requests in flight, then the batchers
run what is queued. :func:`serve` does the same
until SIGTERM or SIGINT, as ``tensorfleet serve`` does.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import threading
from pathlib import Path
from typing import Callable, Sequence

from tensorfleet.serving.batching import BatchingOptions
from tensorfleet.serving.grpc_api import GrpcServer
from tensorfleet.serving.model_config import ModelEntry, read_model_config
from tensorfleet.serving.options import FrontOptions, ScalingOptions, StageOptions, VersionOptions
from tensorfleet.serving.predictor import Predictor
from tensorfleet.serving.repository import ModelRepository
from tensorfleet.serving.rest import RestServer
from tensorfleet.serving.router import ModelRouter
from tensorfleet.serving.stages import stage_devices as resolve_stage_devices
from tensorfleet.serving.standby import StandbySupply
from tensorfleet.serving.versions import VersionWatcher
from tensorfleet.validation import integer, number, port as check_port

__all__ = ["ModelServer", "serve"]


class ModelServer:
    """Models served over gRPC (``port``) and REST (``rest_api_port``; 0 turns REST off).

    Args:
        base_path: one model's base directory (``BASE/<version>/saved_model.pb``); or
        model_config_file: TF Serving's text-format ModelServerConfig naming several models, each with
            its base path, version policy and labels (:mod:`~tensorfleet.serving.model_config`); each
            model gets its own versions, batchers and replicas, so each scales on its own.
        model_name: the name clients ask for (default: the base directory's name).
        host: the address both fronts bind; 127.0.0.1 unless another is asked for.
        port: gRPC port (TF Serving's 8500). rest_api_port: REST port (8501).
        batching: dynamic batching options; None runs one signature call per request.
        versions: which versions are served and their labels (:class:`VersionOptions`).
        scaling: replicas in worker processes, elastic or scaling to zero (:class:`ScalingOptions`).
        stages: model-parallel serving stage to stage (:class:`StageOptions`).
        front: request size limit, drain time, request threads (:class:`FrontOptions`).
        poll_seconds: how often the base directories are checked for new versions (0: never).

    Example:
        >>> with ModelServer("models/digits", port=8500, rest_api_port=8501) as server:  # doctest: +SKIP
        ...     print(server.versions)
        [1]
    """

    def __init__(self, base_path: str | os.PathLike[str] | None = None, *, model_name: str | None = None,
                 host: str = "127.0.0.1", port: int = 8500, rest_api_port: int = 8501,
                 batching: BatchingOptions | None = None, versions: VersionOptions | None = None,
                 scaling: ScalingOptions | None = None, stages: StageOptions | None = None,
                 front: FrontOptions | None = None, poll_seconds: float = 1.0,
                 model_config_file: str | os.PathLike[str] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        if (base_path is None) == (model_config_file is None):
            raise ValueError("ModelServer serves one base_path or the models of a model_config_file (one of the "
                             f"two). Received: base_path={base_path!r}, model_config_file={model_config_file!r}")
        self.host = host
        self.port = check_port("port", port)
        self.rest_api_port = integer("rest_api_port", rest_api_port, minimum=0, maximum=65535)
        self.front = front or FrontOptions()
        self.scaling = scaling or ScalingOptions()
        self.stage_options = stages or StageOptions()
        self.max_request_bytes, self.drain_seconds = self.front.max_request_bytes, self.front.drain_seconds
        self.poll_seconds = number("poll_seconds", poll_seconds, minimum=0)
        devices: Sequence[str] | None = self.stage_options.devices
        if devices and self.stage_options.stages > 1:  # before loading starts TensorFlow's runtime
            devices = resolve_stage_devices(list(devices), self.stage_options.stages)
        if model_config_file is not None:
            entries = read_model_config(model_config_file)
        else:
            assert base_path is not None  # one of the two (checked above)
            v = versions or VersionOptions()
            entries = [ModelEntry(model_name or Path(base_path).resolve().name, Path(base_path), v.policy.value,
                                  v.num_versions, v.versions, dict(v.labels))]
        # one process with TensorFlow imported stands by for whichever model starts a replica next
        self.standby = StandbySupply() if self.scaling.min_replicas == 0 else None
        self.predictors = {e.name: self._predictor(e, batching, devices) for e in entries}
        self.base_path = entries[0].base_path
        self.model_name = entries[0].name
        self.predictor = self.predictors[self.model_name]
        self.repository = self.predictor.repository
        self.router = self.predictor if len(entries) == 1 else ModelRouter(self.predictors)
        self.log = log or (lambda line: None)
        self._grpc: GrpcServer | None = None
        self._rest: RestServer | None = None
        self.watchers: list[VersionWatcher] = []
        self._stopped = threading.Event()

    def _predictor(self, entry: ModelEntry, batching: BatchingOptions | None,
                   devices: Sequence[str] | None) -> Predictor:
        repository = ModelRepository(entry.name, entry.base_path, policy=entry.policy, labels=entry.labels,
                                     num_versions=entry.num_versions, specific=entry.versions)
        stages = dataclasses.replace(self.stage_options, devices=tuple(devices) if devices else None)
        return Predictor(repository, batching=batching, request_threads=self.front.request_threads,
                         scaling=self.scaling, stages=stages, standby=self.standby)

    @property
    def versions(self) -> list[int]:
        """The versions served of the (first) model."""
        return self.repository.versions

    @property
    def watcher(self) -> VersionWatcher | None:
        """The (first) model's version watcher, if polling."""
        return self.watchers[0] if self.watchers else None

    def start(self) -> ModelServer:
        """Loads the models and starts both fronts; a port in use fails here, with nothing left running."""
        try:
            for name, predictor in self.predictors.items():
                self._start_model(name, predictor)
            if self.standby is not None:
                self.log(f"standby process with TensorFlow imported: pid {self.standby.wait()}")
            self._grpc = GrpcServer(self.router, self.host, self.port, max_message_bytes=self.max_request_bytes,
                                    drain_seconds=self.drain_seconds)
            self._grpc.start()
            self.log(f"gRPC  {self.host}:{self.port} (tensorflow.serving.PredictionService, ModelService)")
            if self.rest_api_port:
                self._rest = RestServer(self.router, self.host, self.rest_api_port,
                                        max_body_bytes=self.max_request_bytes, drain_seconds=self.drain_seconds)
                self._rest.start()
                for name in self.predictors:
                    self.log(f"REST  http://{self.host}:{self.rest_api_port}/v1/models/{name}")
            if self.poll_seconds:
                self.watchers = [VersionWatcher(p, seconds=self.poll_seconds, drain_seconds=self.drain_seconds,
                                                log=self.log).start() for p in self.predictors.values()]
        except BaseException:
            self.stop()
            raise
        batching = self.predictor.batching
        self.log("batching: " + ("off (one signature call per request)" if batching is None else
                                  f"{batching.policy.value}, max_batch_size={batching.max_batch_size}, "
                                  f"batch_timeout_micros={batching.batch_timeout_micros}, "
                                  f"num_batch_threads={batching.num_batch_threads}, sizes={list(batching.sizes)}"))
        return self

    def _start_model(self, name: str, predictor: Predictor) -> None:
        repository = predictor.repository
        versions = repository.load()
        warm = {v: s.warmup_records for v, s in repository.servables.items() if s.warmup_records}
        self.log(f"loaded {name!r} version(s) {versions} from {repository.base}"
                 + (f", warm-up records replayed {warm}" if warm else ""))
        predictor.start_replicas(self.log)
        if predictor.stages > 1:
            devices = [r.devices for r in predictor.staged.values()][:1]
            self.log(f"stages: {predictor.stages}, {predictor.micro_batches} micro-batches per request"
                     + (f", on {', '.join(devices[0])}" if devices and devices[0] else ""))
        if predictor.replicated:
            elastic = (f", elastic {predictor.min_replicas} to {predictor.max_replicas}"
                       if predictor.max_replicas > predictor.min_replicas else "")
            idle = f", to zero after {predictor.idle_timeout:g} s idle" if predictor.min_replicas == 0 else ""
            self.log(f"replicas of {name!r}: {predictor.replicas} worker processes per version{elastic}{idle}, "
                     f"pids { {v: p.pids() for v, p in predictor.pools.items()} }")

    def stop(self) -> None:
        """Stops listening, finishes requests in flight (up to ``drain_seconds``), then the batchers."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        for watcher in self.watchers:
            watcher.stop()
        fronts = [f for f in (self._rest, self._grpc) if f is not None]
        threads = [threading.Thread(target=front.stop) for front in fronts]  # both drain at once
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for name, predictor in self.predictors.items():
            scalers = list(predictor.autoscalers.values())
            predictor.close()
            if self.scaling.plot and scalers:
                path = Path(self.scaling.plot)
                if len(self.predictors) > 1:
                    path = path.with_name(f"{path.stem}-{name}{path.suffix}")
                self.log(f"scale events of {name!r} plotted to {scalers[-1].plot(path)}")
        if self.standby is not None:
            self.standby.close()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until :meth:`stop` has been called (or ``timeout``); True if it was."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(base_path: str | os.PathLike[str] | None = None, **options: object) -> None:
    """Runs a :class:`ModelServer` until SIGTERM or SIGINT, then drains it and returns.

    Takes :class:`ModelServer`'s arguments. Must run in the main thread (it installs the signal handlers).

    Example:
        >>> serve("models/digits", model_name="digits", port=8500, rest_api_port=8501)  # doctest: +SKIP
    """
    server = ModelServer(base_path, **options)  # type: ignore[arg-type]
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    started = False
    try:
        server.start()
        started = True
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
        if started:  # a start-up error is the last word, not a "stopped" after it
            server.log("stopped")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
