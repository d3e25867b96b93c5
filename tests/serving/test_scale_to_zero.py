"""Serving that scales to zero, warm-up records and several models: one server of a two-model
ModelServerConfig (``a`` serves version 1, which carries warm-up records, ``b`` version 2), each at
--min-replicas 0 with a short idle window. Its tests run in order on that one server: both start at zero,
warm-up records are replayed before a replica's first call, each model answers over gRPC too, only
the busy model keeps a replica while the idle one goes to zero after its window and answers again
after a cold start, a scale-down under load loses nothing, and the plot."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import numpy as np
import pytest

from tensorfleet.serving.options import ScalingOptions

from .conftest import assert_float32_close, free_ports

pytestmark = pytest.mark.slow  # the server's replicas are processes (multiprocessing), started by the module's fixture

CONFIG = """model_config_list {
  config { name: "a" base_path: "zbase" model_platform: "tensorflow"
           model_version_policy { specific { versions: 1 } } version_labels { key: "stable" value: 1 } }
  config { name: "b" base_path: "zbase" model_version_policy { latest { num_versions: 1 } } }
}
"""


@pytest.fixture(scope="module")
def zero_server(tmp_path_factory, digits_models, images):
    from tensorfleet.serving import ModelServer, export

    root = tmp_path_factory.mktemp("zero")
    export(digits_models[1], root / "zbase", version=1, warmup=images[:3])
    export(digits_models[2], root / "zbase", version=2)
    (root / "models.config").write_text(CONFIG)
    grpc_port, rest_port = free_ports()
    log: list[str] = []
    server = ModelServer(model_config_file=root / "models.config", port=grpc_port, rest_api_port=rest_port,
                         scaling=ScalingOptions(min_replicas=0, max_replicas=1, idle_timeout=3.0,
                                                plot=str(root / "scale.png")),
                         poll_seconds=0, log=log.append).start()
    server.test_log, server.test_root = log, root
    yield server
    server.stop()


def _rest(server, model: str, rows: np.ndarray) -> np.ndarray:
    body = json.dumps({"instances": rows.tolist()}).encode()
    url = f"http://127.0.0.1:{server.rest_api_port}/v1/models/{model}:predict"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=60) as reply:
        return np.array(json.loads(reply.read())["predictions"], np.float32)


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def _pool(server, model: str):
    (pool,) = server.predictors[model].pools.values()
    return pool


def _metrics(server) -> str:
    url = f"http://127.0.0.1:{server.rest_api_port}/monitoring/prometheus/metrics"
    with urllib.request.urlopen(url, timeout=30) as reply:
        return reply.read().decode()


def test_a_model_starts_at_zero_and_its_first_request_replays_the_warmup_records_first(
        zero_server, digits_models, images):
    a, b = zero_server.predictors["a"], zero_server.predictors["b"]
    assert a.repository.versions == [1] and b.repository.versions == [2]
    assert a.repository.servables[1].warmup_records == 3  # in the front's process, at load
    assert b.repository.servables[2].warmup_records == 0  # version 2 has no warm-up file
    pool = _pool(zero_server, "a")
    assert pool.size == 0 and _pool(zero_server, "b").size == 0 and pool.cold_starts == []
    assert_float32_close(_rest(zero_server, "a", images[:2]), digits_models[1].predict(images[:2], verbose=0))
    assert len(pool.cold_starts) == 1 and pool.calls == 1
    assert pool.warmup_records == 3  # replayed in the replica process before it took the call
    assert "loaded 'a' version(s) [1] from" in "\n".join(zero_server.test_log)


def test_each_model_answers_over_grpc_and_its_own_status(zero_server, digits_models, images):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import (
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    with grpc.insecure_channel(f"127.0.0.1:{zero_server.port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for model, version in (("a", 1), ("b", 2)):
            request = predict_pb2.PredictRequest()
            request.model_spec.name = model
            request.inputs["image"].CopyFrom(tf.make_tensor_proto(images[:3]))
            reply = stub.Predict(request, timeout=60)
            assert reply.model_spec.version.value == version
            assert_float32_close(tf.make_ndarray(reply.outputs["logits"]),
                                 digits_models[version].predict(images[:3], verbose=0))
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "b"}), timeout=30)
        assert [s.version for s in status.model_version_status] == [2]
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "c"
        request.inputs["image"].CopyFrom(tf.make_tensor_proto(images[:1]))
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=30)
        assert info.value.code() is grpc.StatusCode.NOT_FOUND and "serves ['a', 'b']" in info.value.details()


def test_only_the_busy_model_keeps_a_replica_and_the_idle_one_goes_to_zero_and_answers_after_one_cold_start(
        zero_server, digits_models, images):
    a, b = _pool(zero_server, "a"), _pool(zero_server, "b")
    stop = threading.Event()
    answers: list[np.ndarray] = []

    def busy() -> None:
        while not stop.is_set():
            answers.append(_rest(zero_server, "a", images[:2]))
            time.sleep(0.2)

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        assert _wait(lambda: answers and a.size == 1, 60)
        colds = len(a.cold_starts)
        assert _wait(lambda: b.size == 0, 30)  # b's window (3 s) passes while a stays busy
        assert a.size == 1 and len(a.cold_starts) == colds
    finally:
        stop.set()
        thread.join(60)
    for answer in answers:
        assert_float32_close(answer, digits_models[1].predict(images[:2], verbose=0))
    # The pool's count drops before the scaler logs the event: wait for the line, not only the count.
    assert _wait(lambda: any(line.startswith("scaled 'b' v2 from 1 to 0 replicas: no request for 3 s (idle timeout)")
                             for line in zero_server.test_log), 30)
    colds = len(b.cold_starts)
    assert_float32_close(_rest(zero_server, "b", images[:4]), digits_models[2].predict(images[:4], verbose=0))
    assert len(b.cold_starts) == colds + 1  # the next request after zero: one cold start
    assert all(seconds > 0 for _, seconds in b.cold_starts)
    metrics = _metrics(zero_server)
    assert f':tensorflow:serving:cold_starts_total{{model_name="b",version="2"}} {colds + 1}' in metrics
    assert f':tensorflow:serving:cold_start_seconds_count{{model_name="b",version="2"}} {colds + 1}' in metrics
    assert ':tensorflow:serving:replicas{model_name="a",version="1"} ' in metrics
    assert metrics.count("# TYPE :tensorflow:serving:replica_seconds_total counter") == 1
    assert ':tensorflow:serving:replica_seconds_total{model_name="a",version="1"} ' in metrics


def test_a_scale_down_under_load_loses_nothing_and_answers_each_call_once(zero_server, digits_models, images):
    """Callers keep model a busy while its replica is stopped (once idle, so it holds no call); the
    calls that find no replica wait for a cold start. Every call is answered, correctly, once."""
    pool = _pool(zero_server, "a")
    expected = digits_models[1].predict(images[:8], verbose=0)
    calls_before, colds_before = pool.calls, len(pool.cold_starts)
    sent, answered, stop = [0], [], threading.Event()
    lock = threading.Lock()

    def caller() -> None:
        while not stop.is_set():
            with lock:
                sent[0] += 1
            answered.append(pool.run("serving_default", {"image": images[:8]})["logits"])

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        assert _wait(lambda: pool.size == 1 and pool.calls > calls_before, 60)
        assert pool.shrink(timeout=30, minimum=0) == 0
        assert _wait(lambda: pool.size == 1 and len(pool.cold_starts) > colds_before, 60)
        after_cold = pool.calls
        assert _wait(lambda: pool.calls >= after_cold + 3, 60)  # and calls go on on the new replica
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert len(answered) == sent[0] == pool.calls - calls_before and pool.retries == 0
    for answer in answered:
        assert_float32_close(answer, expected)
    assert len(pool.cold_starts) - colds_before >= 1


def test_the_scale_plot_shows_each_model_with_its_cold_starts(zero_server):
    zero_server.stop()
    for model in ("a", "b"):
        assert (zero_server.test_root / f"scale-{model}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
