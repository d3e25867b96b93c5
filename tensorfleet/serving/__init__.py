"""Serving what was trained: a TF Serving-compatible model server.

* :func:`export` writes a Keras model (built under any strategy or none) as a SavedModel in TF
  Serving's versioned layout, ``BASE/<version>/``, with a ``serving_default`` signature whose
  input and output names it states.
* :class:`ModelServer` / :func:`serve` serve ``BASE`` (or the models of TF Serving's
  ``--model_config_file``, :mod:`~tensorfleet.serving.model_config`) over TF Serving's gRPC API (grpcio, with
  tensorflow-serving-api's own protos) and REST API (httptools on uvloop), with dynamic batching
  (:mod:`~tensorfleet.serving.batching`) and TF Serving's status codes for bad requests.
* The parts: :mod:`~tensorfleet.serving.servable` (one loaded version and its checks),
  :mod:`~tensorfleet.serving.repository` (versions and labels), :mod:`~tensorfleet.serving.predictor`
  (what both fronts call), :mod:`~tensorfleet.serving.rest` (on :mod:`~tensorfleet.serving.http`),
  :mod:`~tensorfleet.serving.grpc_api`,
  :mod:`~tensorfleet.serving.replicas` (the model in worker processes, restarted when one dies),
  :mod:`~tensorfleet.serving.elastic` (replicas added under queueing, removed when idle, to zero),
  :mod:`~tensorfleet.serving.warmup` (TF Serving's warm-up records, written and replayed),
  :mod:`~tensorfleet.serving.router` (several models behind one server),
  :mod:`~tensorfleet.serving.stages` (a model served stage to stage, micro-batches in flight),
  :mod:`~tensorfleet.serving.versions` (new versions picked up while serving) and
  :mod:`~tensorfleet.serving.metrics` (Prometheus text at TF Serving's monitoring path).

Example:
    >>> import tensorfleet as tfl
    >>> result = tfl.serving.export(model, "models/digits", version=1)  # doctest: +SKIP
    >>> tfl.serving.serve("models/digits", port=8500, rest_api_port=8501)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorfleet.lazy import attach

__getattr__, _LAZY = attach(
    __name__,
    internal=("batching", "elastic", "errors", "grpc_api", "http", "k8s", "metrics", "model_config", "options",
             "predictor", "replicas", "repository", "rest", "router", "saved_model", "servable", "server", "stages",
             "versions", "warmup"),
    names={
        "export": "saved_model", "load_keras_model": "saved_model", "ExportResult": "saved_model",
        "TensorSignature": "saved_model", "VersionExistsError": "saved_model", "BaseNotAFolderError": "saved_model",
        "SavedModelError": "servable",
        "ModelServer": "server", "serve": "server", "BatchingOptions": "batching", "Batcher": "batching",
        "BatchingPolicy": "batching",
        "ServingError": "errors", "ModelRepository": "repository", "Predictor": "predictor",
        "ReplicaPool": "replicas", "VersionWatcher": "versions", "ServingMetrics": "metrics",
        "Autoscaler": "elastic", "StagedRunner": "stages", "serving_manifests": "k8s",
        "VersionOptions": "options", "ScalingOptions": "options", "StageOptions": "options", "FrontOptions": "options",
        "ModelRouter": "router", "read_model_config": "model_config",
    },
)

if TYPE_CHECKING:  # what the lazy map above serves, for editors and type checkers (not run)
    from tensorfleet.serving.batching import Batcher, BatchingOptions, BatchingPolicy
    from tensorfleet.serving.elastic import Autoscaler
    from tensorfleet.serving.errors import ServingError
    from tensorfleet.serving.k8s import serving_manifests
    from tensorfleet.serving.metrics import ServingMetrics
    from tensorfleet.serving.model_config import read_model_config
    from tensorfleet.serving.options import FrontOptions, ScalingOptions, StageOptions, VersionOptions
    from tensorfleet.serving.predictor import Predictor
    from tensorfleet.serving.replicas import ReplicaPool
    from tensorfleet.serving.repository import ModelRepository
    from tensorfleet.serving.router import ModelRouter
    from tensorfleet.serving.saved_model import (
        BaseNotAFolderError,
        ExportResult,
        TensorSignature,
        VersionExistsError,
        export,
        load_keras_model,
    )
    from tensorfleet.serving.servable import SavedModelError
    from tensorfleet.serving.server import ModelServer, serve
    from tensorfleet.serving.stages import StagedRunner
    from tensorfleet.serving.versions import VersionWatcher

__all__ = list(dict.fromkeys(_LAZY))
