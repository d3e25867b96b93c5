"""The gRPC API with TF Serving's own client (prediction_service_pb2_grpc.PredictionServiceStub)
over a real socket: Predict, GetModelMetadata, GetModelStatus, version pinning and the status
codes of bad requests."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from .conftest import assert_float32_close


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield channel


def _request(x, *, name="digits", version=None, label=None, signature="serving_default", key="image"):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    request.inputs[key].CopyFrom(tf.make_tensor_proto(x))
    return request


def test_predict_returns_the_models_own_outputs(channel, digits_models, images):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    response = stub.Predict(_request(images[:7]), timeout=30)
    assert (response.model_spec.name, response.model_spec.version.value, response.model_spec.signature_name) == (
        "digits", 2, "serving_default")
    assert_float32_close(tf.make_ndarray(response.outputs["logits"]),
                         digits_models[2].predict(images[:7], verbose=0))
    pinned = stub.Predict(_request(images[:7], version=1), timeout=30)
    assert pinned.model_spec.version.value == 1
    assert_float32_close(tf.make_ndarray(pinned.outputs["logits"]),
                         digits_models[1].predict(images[:7], verbose=0))
    assert stub.Predict(_request(images[:2], label="stable"), timeout=30).model_spec.version.value == 1


def test_get_model_metadata_returns_the_signature_def_map(channel):
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "digits"
    request.metadata_field.append("signature_def")
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request, timeout=30)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_map)
    sig = signature_map.signature_def["serving_default"]
    assert list(sig.inputs) == ["image"] and list(sig.outputs) == ["logits"]
    assert [d.size for d in sig.inputs["image"].tensor_shape.dim] == [-1, 8, 8, 1]
    assert response.model_spec.version.value == 2


def test_get_model_status_reports_each_version_available(channel):
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "digits"
    response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=30)
    available = get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert [(s.version, s.state, s.status.error_code) for s in response.model_version_status] == [
        (1, available, 0), (2, available, 0)]


def _bad(images):
    x = images[:2]
    return [
        ("unknown model", dict(name="mnist"), x, grpc.StatusCode.NOT_FOUND, "model 'mnist' is not served"),
        ("unknown version", dict(version=9), x, grpc.StatusCode.NOT_FOUND, "Specific(digits, 9)"),
        ("unknown label", dict(label="beta"), x, grpc.StatusCode.NOT_FOUND, "label: 'beta'"),
        ("wrong dtype", {}, x.astype(np.float64), grpc.StatusCode.INVALID_ARGUMENT,
         "Input 'image' must be float32. Received: float64"),
        ("wrong shape", {}, x[:, :4], grpc.StatusCode.INVALID_ARGUMENT,
         "must have shape float32[None, 8, 8, 1]. Received: float32[2, 4, 8, 1]"),
        ("unknown input", dict(key="pixels"), x, grpc.StatusCode.INVALID_ARGUMENT, "unknown ['pixels']"),
        ("unknown signature", dict(signature="nope"), x, grpc.StatusCode.FAILED_PRECONDITION, "'nope' not found"),
    ]


@pytest.mark.parametrize("case", _bad(np.zeros((2, 8, 8, 1), np.float32)), ids=lambda c: c[0])
def test_bad_requests_get_tf_servings_status_codes(channel, images, case):
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    _, spec, x, code, message = case
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(_request(x, **spec), timeout=30)
    assert caught.value.code() == code
    assert message in caught.value.details()
    assert stub.Predict(_request(images[:2]), timeout=30).model_spec.version.value == 2


def test_an_oversized_message_is_refused_and_unimplemented_methods_say_so(channel, images):
    from tensorflow_serving.apis import classification_pb2, prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    with pytest.raises(grpc.RpcError) as caught:  # the server's limit is 64 KiB
        stub.Predict(_request(np.zeros((300, 8, 8, 1), np.float32)), timeout=30)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.RpcError) as caught:
        stub.Classify(classification_pb2.ClassificationRequest(), timeout=30)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_every_serving_error_code_is_a_grpc_status_code():
    from tensorfleet.serving.errors import Code

    assert all(hasattr(grpc.StatusCode, code.value) for code in Code)


def test_a_port_in_use_fails_at_start_and_leaves_nothing_running(server, model_base):
    from tensorfleet.serving import ModelServer

    from .conftest import free_ports

    second = ModelServer(model_base, model_name="digits", port=server.port, rest_api_port=free_ports(1)[0])
    with pytest.raises(OSError, match=rf"Could not serve gRPC on 127.0.0.1:{server.port}"):
        second.start()
    assert second.predictor.ready is False
    third = ModelServer(model_base, model_name="digits", port=free_ports(1)[0], rest_api_port=server.rest_api_port)
    with pytest.raises(OSError, match=rf"Could not serve REST on 127.0.0.1:{server.rest_api_port}"):
        third.start()
