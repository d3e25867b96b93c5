"""Metrics in Prometheus' text format at TF Serving's path, and the health and readiness endpoints."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc

from tensorfleet.serving.batching import BatchingOptions
from tensorfleet.serving.metrics import ServingMetrics

from .conftest import start_server


def test_the_text_format_of_every_metric():
    metrics = ServingMetrics("digits", queue_depth=lambda: 3)
    metrics.observe_request("rest", "OK", 0.0004)
    metrics.observe_request("rest", "NOT_FOUND", 0.002)
    metrics.observe_batch(3)
    text = metrics.render().splitlines()
    assert text[:3] == [
        "# TYPE :tensorflow:serving:request_count counter",
        ':tensorflow:serving:request_count{model_name="digits",entrypoint="rest",status="NOT_FOUND"} 1',
        ':tensorflow:serving:request_count{model_name="digits",entrypoint="rest",status="OK"} 1',
    ]
    assert ':tensorflow:serving:request_latency_bucket{model_name="digits",entrypoint="rest",le="250"} 0' in text
    assert ':tensorflow:serving:request_latency_bucket{model_name="digits",entrypoint="rest",le="500"} 1' in text
    assert ':tensorflow:serving:request_latency_count{model_name="digits",entrypoint="rest"} 2' in text
    assert ':tensorflow:serving:batch_size_bucket{model_name="digits",le="2"} 0' in text
    assert ':tensorflow:serving:batch_size_bucket{model_name="digits",le="4"} 1' in text
    assert text[-3:] == [':tensorflow:serving:queue_depth{model_name="digits"} 3',
                         "# TYPE :tensorflow:serving:requests_in_flight gauge",
                         ':tensorflow:serving:requests_in_flight{model_name="digits"} 0']


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_running_server_counts_its_requests_and_batches(model_base, images):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    server = start_server(model_base, batching=BatchingOptions(max_batch_size=8, batch_timeout_micros=0))
    try:
        port = server.rest_api_port
        assert _get(port, "/healthz") == (200, b'{"status": "alive"}')
        assert json.loads(_get(port, "/readyz")[1]) == {"ready": True, "versions": [2]}
        body = json.dumps({"instances": images[:3].tolist()}).encode()
        url = f"http://127.0.0.1:{port}/v1/models/digits:predict"
        for _ in range(2):
            urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30).close()
        assert _get(port, "/v1/models/nope")[0] == 404
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "digits"
        request.inputs["image"].CopyFrom(tf.make_tensor_proto(images[:5]))
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        status, text = _get(port, "/monitoring/prometheus/metrics")
        lines = text.decode().splitlines()
        assert status == 200
        assert ':tensorflow:serving:request_count{model_name="digits",entrypoint="rest",status="OK"} 2' in lines
        assert ':tensorflow:serving:request_count{model_name="digits",entrypoint="rest",status="NOT_FOUND"} 1' in lines
        assert ':tensorflow:serving:request_count{model_name="digits",entrypoint="grpc",status="OK"} 1' in lines
        # batches of 3, 3 and 5 rows, padded to 4, 4 and 8
        assert ':tensorflow:serving:batch_size_bucket{model_name="digits",le="4"} 2' in lines
        assert ':tensorflow:serving:batch_size_count{model_name="digits"} 3' in lines
        assert ':tensorflow:serving:batch_size_sum{model_name="digits"} 16' in lines
        assert ':tensorflow:serving:queue_depth{model_name="digits"} 0' in lines
        assert ':tensorflow:serving:requests_in_flight{model_name="digits"} 0' in lines
    finally:
        server.stop()
    assert server.predictor.ready is False
