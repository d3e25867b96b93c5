"""TF Serving's gRPC API on grpcio's server, with tensorflow-serving-api's own protos and servicers.

``tensorflow.serving.PredictionService`` (``Predict``, ``GetModelMetadata``; ``Classify``,
``Regress`` and ``MultiInference`` answer UNIMPLEMENTED) and ``tensorflow.serving.ModelService``
(``GetModelStatus``), so ``prediction_service_pb2_grpc.PredictionServiceStub`` works unchanged.
Each refusal is the gRPC status TF Serving uses, with a message naming what was wrong.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import grpc
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from tensorfleet.serving.errors import ServingError, as_serving_error
from tensorfleet.serving.router import Front

__all__ = ["GrpcServer", "ModelStatusServicer", "PredictionServicer"]


def _aborts_on_error(method: Callable) -> Callable:
    """Turns any failure of ``method`` into the gRPC status TF Serving would answer."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        start, status = time.perf_counter(), "OK"
        try:
            return method(self, request, context)
        except Exception as exc:
            error = as_serving_error(exc)
            status = error.code.value
            context.abort(grpc.StatusCode[error.code.value], error.message)
        finally:
            self.predictor.metrics.observe_request("grpc", status, time.perf_counter() - start,
                                                   model=getattr(getattr(request, "model_spec", None), "name", None))

    return wrapper


def _spec(request: Any) -> tuple[str, int | None, str | None, str | None]:
    spec = request.model_spec
    version = spec.version.value if spec.HasField("version") else None
    return spec.name, version, spec.version_label or None, spec.signature_name or None


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``tensorflow.serving.PredictionService`` over a :class:`~tensorfleet.serving.predictor.Predictor`."""

    def __init__(self, predictor: Front, *, timeout: float = 60.0) -> None:
        self.predictor = predictor
        self.timeout = timeout

    @_aborts_on_error
    def Predict(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 - gRPC's name
        import tensorflow as tf

        name, version, label, signature = _spec(request)
        try:
            inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        except (ValueError, TypeError) as exc:
            raise ServingError(f"An input TensorProto could not be read: {exc}") from None
        prediction = self.predictor.submit(name, inputs, version=version, label=label, signature_name=signature,
                                           output_filter=list(request.output_filter) or None, strict_dtype=True)
        outputs = prediction.result(self.timeout)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = name
        response.model_spec.version.value = prediction.servable.version
        response.model_spec.signature_name = prediction.signature.name
        for key, value in outputs.items():
            response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
        return response

    @_aborts_on_error
    def GetModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        name, version, label, _ = _spec(request)
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise ServingError(f"Only metadata_field ['signature_def'] is served. Received: {fields}")
        servable = self.predictor.repository.get(name, version, label)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = name
        response.model_spec.version.value = servable.version
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for key, value in servable.signature_defs().items():
            signature_map.signature_def[key].CopyFrom(value)
        response.metadata["signature_def"].Pack(signature_map)
        return response

    def _unimplemented(self, request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Only Predict and GetModelMetadata are served.")

    Classify = Regress = MultiInference = _unimplemented


class ModelStatusServicer(model_service_pb2_grpc.ModelServiceServicer):
    """``tensorflow.serving.ModelService.GetModelStatus`` (reloading config is not served)."""

    def __init__(self, predictor: Front) -> None:
        self.predictor = predictor
        self.repository = predictor.repository

    @_aborts_on_error
    def GetModelStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        name, version, _, _ = _spec(request)
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, state in self.repository.status(name, version):
            entry = response.model_version_status.add()
            entry.version = number
            entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(state)
        return response

    def HandleReloadConfigRequest(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Reloading the model config is not served.")


class GrpcServer:
    """The gRPC front: grpcio's server on ``host:port`` with both services."""

    def __init__(self, predictor: Front, host: str, port: int, *, max_message_bytes: int = 4 << 20,
                 workers: int = 16, drain_seconds: float = 10.0) -> None:
        self.host, self.port, self.drain_seconds = host, port, drain_seconds
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tfl-serving-grpc"),
            options=[("grpc.max_receive_message_length", max_message_bytes),
                     ("grpc.max_send_message_length", -1),
                     ("grpc.so_reuseport", 0)])  # a port already taken is an error, not shared
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            PredictionServicer(predictor), self._server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelStatusServicer(predictor), self._server)

    def start(self) -> None:
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            bound = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"Could not serve gRPC on {address}: {exc}") from exc
        if not bound:
            raise OSError(f"Could not serve gRPC on {address} (is the port taken?).")
        self._server.start()

    def stop(self) -> None:
        """Refuses new calls and waits up to ``drain_seconds`` for the ones in flight."""
        self._server.stop(self.drain_seconds).wait(self.drain_seconds + 5)

