"""A signature with two inputs and two outputs: REST rows as objects, columns as a dict, replies
with one object per row or one list per output; gRPC output_filter; integer inputs checked."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from tensorfleet.compat.keras import keras2

from .conftest import assert_float32_close, start_server

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


@pytest.fixture(scope="module")
def two_way(tmp_path_factory):
    import tensorflow as tf

    from tensorfleet.serving import export

    features = tf_keras.Input(shape=(3,), name="features")
    bucket = tf_keras.Input(shape=(), dtype=tf.int32, name="bucket")
    init = tf_keras.initializers
    embedded = tf_keras.layers.Embedding(5, 3, embeddings_initializer=init.RandomNormal(seed=1))(bucket)
    summed = tf_keras.layers.Add()([features, embedded])
    score = tf_keras.layers.Dense(1, kernel_initializer=init.GlorotUniform(seed=2), name="score")(summed)
    doubled = tf_keras.layers.Lambda(lambda t: t * 2.0, name="doubled")(features)
    model = tf_keras.Model([features, bucket], [score, doubled])
    base = tmp_path_factory.mktemp("two") / "two"
    result = export(model, base, version=1)
    assert [str(t) for t in result.inputs] == ["features: float32[None, 3]", "bucket: int32[None]"]
    assert [str(t) for t in result.outputs] == ["score: float32[None, 1]", "doubled: float32[None, 3]"]
    server = start_server(base)
    yield model, server
    server.stop()


X = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], np.float32)
B = np.array([3, 1], np.int32)


def _post(server, body):
    url = f"http://127.0.0.1:{server.rest_api_port}/v1/models/digits:predict"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=json.dumps(body).encode()), timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_rows_and_columns_with_two_inputs_and_two_outputs(two_way):
    model, server = two_way
    score, doubled = model.predict([X, B], verbose=0)
    status, rows = _post(server, {"instances": [{"features": x, "bucket": int(b)} for x, b in zip(X.tolist(), B)]})
    assert status == 200
    assert [sorted(r) for r in rows["predictions"]] == [["doubled", "score"]] * 2
    assert_float32_close(np.array([r["score"] for r in rows["predictions"]], np.float32), score)
    assert_float32_close(np.array([r["doubled"] for r in rows["predictions"]], np.float32), doubled)
    status, columns = _post(server, {"inputs": {"features": X.tolist(), "bucket": B.tolist()}})
    assert status == 200
    assert_float32_close(np.array(columns["outputs"]["score"], np.float32), score)
    assert_float32_close(np.array(columns["outputs"]["doubled"], np.float32), doubled)


def test_two_input_mistakes_are_named(two_way):
    _, server = two_way
    assert _post(server, {"instances": [X[0].tolist()]}) == (400, {
        "error": "With several inputs ['bucket', 'features'], each instance must be an object keyed by input name."})
    assert _post(server, {"instances": [{"features": X[0].tolist()}]}) == (400, {
        "error": "Every instance must name each input ['bucket', 'features']; missing ['bucket']."})
    assert _post(server, {"inputs": {"features": X.tolist(), "bucket": [1.5, 2]}}) == (400, {
        "error": "Input 'bucket' must hold integers (int32). Received fractions: [1.5, 2]"})
    assert _post(server, {"inputs": {"features": X.tolist(), "bucket": [1]}}) == (400, {
        "error": "All inputs must have the same batch size. Received: {'bucket': 1, 'features': 2}"})


def test_grpc_output_filter_returns_only_the_named_outputs(two_way):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    model, server = two_way
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(X))
    request.inputs["bucket"].CopyFrom(tf.make_tensor_proto(B))
    request.output_filter.append("doubled")
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        reply = stub.Predict(request, timeout=30)
        assert list(reply.outputs) == ["doubled"]
        assert_float32_close(tf.make_ndarray(reply.outputs["doubled"]), model.predict([X, B], verbose=0)[1])
        request.output_filter[:] = ["nope"]
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Unknown output(s) ['nope'] in output_filter" in caught.value.details()
