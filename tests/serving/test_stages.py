"""Model-parallel serving: a model exported as stage signatures and served stage to stage with
micro-batches in flight answers what the unsplit model does (to float32 rounding), over REST and gRPC."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from tensorfleet.serving.options import ScalingOptions, StageOptions

from .conftest import assert_float32_close, start_server


@pytest.fixture(scope="module")
def staged_base(tmp_path_factory, digits_models):
    from tensorfleet.serving import export

    base = tmp_path_factory.mktemp("staged") / "digits"
    result = export(digits_models[1], base, version=1, stages=3)
    assert result.stages == ("stage_0", "stage_1", "stage_2")
    assert result.summary().splitlines()[-1] == (
        "  stages stage_0, stage_1, stage_2 (for `tensorfleet serve --stages 3`)")
    return base


def test_each_stage_signature_feeds_the_next(staged_base, digits_models, images):
    import tensorflow as tf

    signatures = tf.saved_model.load(str(staged_base / "1")).signatures
    x = tf.constant(images[:6])
    a = signatures["stage_0"](image=x)["activations"]
    b = signatures["stage_1"](activations=a)["activations"]
    logits = signatures["stage_2"](activations=b)["logits"]
    assert_float32_close(logits.numpy(), digits_models[1].predict(images[:6], verbose=0))


def test_a_staged_server_answers_the_unsplit_models_outputs(staged_base, digits_models, images):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    server = start_server(staged_base, stages=StageOptions(3, micro_batches=4))
    try:
        expected = digits_models[1].predict(images, verbose=0)
        body = json.dumps({"instances": images[:17].tolist()}).encode()
        url = f"http://127.0.0.1:{server.rest_api_port}/v1/models/digits:predict"
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as reply:
            assert_float32_close(np.array(json.loads(reply.read())["predictions"], np.float32),
                                 expected[:17])
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "digits"
        request.inputs["image"].CopyFrom(tf.make_tensor_proto(images))
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        assert_float32_close(tf.make_ndarray(reply.outputs["logits"]), expected)
        servable = server.repository.get("digits")
        assert servable.calls == 3 * (4 + 4)  # every micro-batch of both requests through the 3 stages
    finally:
        server.stop()


def test_stages_need_stage_signatures_and_not_replicas(model_base):
    from tensorfleet.serving import ModelServer

    with pytest.raises(ValueError, match=r"Serving 2 stages needs signatures \['stage_0', 'stage_1'\]"):
        start_server(model_base, stages=StageOptions(2))
    with pytest.raises(ValueError, match="Serve either stages or replicas, not both"):
        ModelServer(model_base, stages=StageOptions(2), scaling=ScalingOptions(replicas=2))


def test_each_stage_runs_on_the_device_it_was_given(staged_base, digits_models, images):
    server = start_server(staged_base, stages=StageOptions(3, micro_batches=2, devices=("/cpu:1", "/cpu:2", "/cpu:3")))
    try:
        body = json.dumps({"instances": images[:8].tolist()}).encode()
        url = f"http://127.0.0.1:{server.rest_api_port}/v1/models/digits:predict"
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as reply:
            assert_float32_close(np.array(json.loads(reply.read())["predictions"], np.float32),
                                 digits_models[1].predict(images[:8], verbose=0))
        runner = server.predictor.staged[1]
        assert runner.devices == ["/device:CPU:1", "/device:CPU:2", "/device:CPU:3"]
        assert runner.placed == [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in (1, 2, 3)]
    finally:
        server.stop()


def test_stage_devices_are_checked_before_anything_loads(staged_base):
    from tensorfleet.serving import ModelServer

    with pytest.raises(ValueError, match=r"^Give one device per stage: 3 stage\(s\), 2 device\(s\). "
                                         r"Received: stage_devices=\['/cpu:0', '/cpu:1'\]$"):
        ModelServer(staged_base, stages=StageOptions(3, devices=("/cpu:0", "/cpu:1")))
    with pytest.raises(ValueError, match=r"^Unknown stage device '/gpu:0'; this process has \['/device:CPU:0', "
                                         r"'/device:CPU:1', '/device:CPU:2', '/device:CPU:3'\]"):
        ModelServer(staged_base, stages=StageOptions(2, devices=("/cpu:0", "/gpu:0")))
    with pytest.raises(ValueError, match=r"^Unknown stage device '/cpu:7'"):
        ModelServer(staged_base, stages=StageOptions(2, devices=("/cpu:0", "/cpu:7")))
    with pytest.raises(ValueError, match=r"^A stage device is a TensorFlow device name such as '/cpu:1' or "
                                         r"'/gpu:0'. Received: 'cpu1'$"):
        ModelServer(staged_base, stages=StageOptions(2, devices=("cpu1", "/cpu:0")))
    with pytest.raises(ValueError, match=r"^Stage devices place the stages of --stages K \(K >= 2\). "
                                         r"Received: stages=1, stage_devices=\['/cpu:0'\]$"):
        ModelServer(staged_base, stages=StageOptions(devices=("/cpu:0",)))
