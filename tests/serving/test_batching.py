"""Dynamic batching: the sizes and padding math with numpy alone, the Batcher with a numpy
function, then concurrent callers through a real server: each gets exactly its rows, in fewer
signature calls than requests, and only allowed batch sizes reach the signature."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tensorfleet.serving.batching import (
    Batcher,
    BatchingOptions,
    allowed_batch_sizes,
    merge_rows,
    padded_size,
    split_rows,
)

from .conftest import assert_float32_close, start_server


def test_allowed_sizes_padding_and_splitting():
    assert allowed_batch_sizes(64) == (2, 4, 8, 16, 32, 64)
    assert allowed_batch_sizes(24) == (2, 4, 8, 16, 24)
    assert [padded_size(n, (2, 4, 8)) for n in (1, 2, 3, 5, 8, 11)] == [2, 2, 4, 8, 8, 11]
    merged = merge_rows([{"x": np.array([[1, 1]]), "z": np.array([7])},
                         {"x": np.array([[2, 2], [3, 3]]), "z": np.array([8, 9])}], 4)
    assert merged["x"].tolist() == [[1, 1], [2, 2], [3, 3], [0, 0]] and merged["z"].tolist() == [7, 8, 9, 0]
    parts = split_rows({"y": np.arange(8) * 10}, [1, 2, 3])
    assert [p["y"].tolist() for p in parts] == [[0], [10, 20], [30, 40, 50]]


def test_options_are_checked_with_clear_messages():
    with pytest.raises(ValueError, match=r"max_batch_size must be a positive integer. Received: max_batch_size=0"):
        BatchingOptions(max_batch_size=0)
    with pytest.raises(ValueError, match=r"batch_timeout_micros must be an integer >= 0. Received: "):
        BatchingOptions(batch_timeout_micros=-1)
    with pytest.raises(ValueError, match=r"allowed_batch_sizes must end with max_batch_size \(8\)"):
        BatchingOptions(max_batch_size=8, allowed_batch_sizes=(2, 4))
    assert BatchingOptions(max_batch_size=8, allowed_batch_sizes=(8, 2)).sizes == (2, 8)


def test_the_batcher_runs_concurrent_requests_together_and_returns_each_its_rows():
    calls: list[int] = []

    def run(arrays):
        calls.append(arrays["x"].shape[0])
        return {"y": arrays["x"] * 10 + 1}

    batcher = Batcher(run, BatchingOptions(max_batch_size=16, batch_timeout_micros=200_000, num_batch_threads=1,
                                           policy="timeout"))
    requests = [np.arange(i, i + 1 + i % 3, dtype=np.float32) for i in range(12)]  # 1 to 3 rows each
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda x: batcher.submit({"x": x}).result(10)["y"], requests))
    batcher.close()
    for x, y in zip(requests, results):
        assert y.tolist() == (x * 10 + 1).tolist()
    assert len(calls) < len(requests) and sum(calls) >= sum(len(x) for x in requests)
    assert set(calls) <= {2, 4, 8, 16}  # padded to allowed sizes only
    assert batcher.batches == len(calls)


def test_a_failing_batch_fails_each_caller_and_the_batcher_goes_on():
    def run(arrays):
        if np.any(arrays["x"] < 0):
            raise RuntimeError("negative input")
        return {"y": arrays["x"]}

    batcher = Batcher(run, BatchingOptions(max_batch_size=4, batch_timeout_micros=0, num_batch_threads=1))
    with pytest.raises(RuntimeError, match="negative input"):
        batcher.submit({"x": np.array([-1.0])}).result(10)
    assert batcher.submit({"x": np.array([3.0])}).result(10)["y"].tolist() == [3.0]
    batcher.close()


def test_a_done_callable_is_told_each_callers_rows_or_the_failure_and_no_future_is_made():
    def run(arrays):
        if np.any(arrays["x"] < 0):
            raise RuntimeError("negative input")
        return {"y": arrays["x"] * 10}

    told: dict[int, object] = {}
    changed = threading.Condition()

    def done(i):
        def tell(outcome):
            with changed:
                told[i] = outcome
                changed.notify_all()
            if i == 0:
                raise KeyError("a caller's callable that fails")  # the batch thread must live on
        return tell

    def wait_for(count):
        with changed:
            assert changed.wait_for(lambda: len(told) == count, 10), told

    batcher = Batcher(run, BatchingOptions(max_batch_size=4, batch_timeout_micros=100_000, num_batch_threads=1,
                                           policy="timeout"))
    rows = [np.array([1.0]), np.array([2.0, 3.0]), np.array([4.0])]  # 4 rows: one full batch
    assert [batcher.submit({"x": x}, done(i)) for i, x in enumerate(rows)] == [None] * 3
    wait_for(3)
    assert batcher.submit({"x": np.array([-1.0])}, done(3)) is None
    wait_for(4)
    assert batcher.submit({"x": np.array([5.0])}, done(4)) is None
    wait_for(5)
    batcher.close()
    assert {i: told[i]["y"].tolist() for i in (0, 1, 2, 4)} == {0: [10.0], 1: [20.0, 30.0], 2: [40.0], 4: [50.0]}
    assert isinstance(told[3], RuntimeError) and "negative input" in str(told[3])
    assert batcher.batches == 2  # the failed call is not counted


def test_close_runs_what_is_queued_then_refuses_new_requests():
    from tensorfleet.serving.errors import ServingError

    def run(arrays):
        time.sleep(0.05)
        return {"y": arrays["x"]}

    batcher = Batcher(run, BatchingOptions(max_batch_size=2, batch_timeout_micros=0, num_batch_threads=1))
    futures = [batcher.submit({"x": np.array([float(i)])}) for i in range(6)]
    batcher.close()
    assert [f.result(0)["y"].tolist() for f in futures] == [[float(i)] for i in range(6)]
    with pytest.raises(ServingError, match="shutting down"):
        batcher.submit({"x": np.array([1.0])})


@pytest.fixture(scope="module")
def batching_server(model_base):
    server = start_server(model_base, batching=BatchingOptions(max_batch_size=32, batch_timeout_micros=50_000,
                                                               num_batch_threads=1))
    yield server
    server.stop()


def test_concurrent_rest_and_grpc_callers_get_exactly_their_rows_from_fewer_calls(batching_server, digits_models,
                                                                                   images):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    expected = digits_models[2].predict(images, verbose=0)
    servable = batching_server.repository.get("digits")
    calls_before = servable.calls
    slices = [slice(i * 4, i * 4 + 1 + i % 4) for i in range(16)]  # 16 requests of 1 to 4 rows
    rest_url = f"http://127.0.0.1:{batching_server.rest_api_port}/v1/models/digits:predict"

    def rest_call(rows):
        body = json.dumps({"instances": images[rows].tolist()}).encode()
        with urllib.request.urlopen(urllib.request.Request(rest_url, data=body), timeout=30) as reply:
            return np.array(json.loads(reply.read())["predictions"], dtype=np.float32)

    def grpc_call(rows):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "digits"
        request.inputs["image"].CopyFrom(tf.make_tensor_proto(images[rows]))
        with grpc.insecure_channel(f"127.0.0.1:{batching_server.port}") as channel:
            reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        return tf.make_ndarray(reply.outputs["logits"])

    barrier = threading.Barrier(len(slices))

    def call(i):
        barrier.wait(10)
        return (rest_call if i % 2 else grpc_call)(slices[i])

    with ThreadPoolExecutor(len(slices)) as pool:
        results = list(pool.map(call, range(len(slices))))
    for rows, result in zip(slices, results):
        assert_float32_close(result, expected[rows])
    calls = servable.calls - calls_before
    assert 1 <= calls < len(slices), calls
    assert set(servable.batch_sizes) <= {1, 2, 4, 8, 16, 32}  # allowed sizes, or one lone row (adaptive)


def test_adaptive_batching_sends_a_lone_request_at_once_and_gathers_behind_a_running_batch():
    """A lone request does not wait out the timeout (60 s here: the result comes within 10 s); requests
    that arrive while a batch runs wait behind it and go together when it ends."""
    calls: list[int] = []
    first_runs, release = threading.Event(), threading.Event()

    def run(arrays):
        calls.append(arrays["x"].shape[0])
        if len(calls) == 1:
            first_runs.set()
            release.wait(30)
        return {"y": arrays["x"] + 1}

    options = BatchingOptions(max_batch_size=16, batch_timeout_micros=60_000_000, num_batch_threads=2)
    assert options.policy.value == "adaptive"
    batcher = Batcher(run, options)
    try:
        first = batcher.submit({"x": np.array([0.0])})
        assert first_runs.wait(10)
        rest = [batcher.submit({"x": np.array([float(i)])}) for i in range(1, 6)]
        release.set()
        assert first.result(10)["y"].tolist() == [1.0]
        assert [f.result(10)["y"].tolist() for f in rest] == [[2.0], [3.0], [4.0], [5.0], [6.0]]
        lone = batcher.submit({"x": np.array([9.0])}).result(10)  # nothing running: goes at once
        assert lone["y"].tolist() == [10.0]
    finally:
        release.set()
        batcher.close()
    assert calls == [1, 8, 1]  # 1 row alone (unpadded), the 5 that queued meanwhile (padded to 8), 1 row


def test_the_timeout_policy_is_kept_and_policies_are_checked():
    assert BatchingOptions(policy="timeout").policy.value == "timeout"
    with pytest.raises(ValueError, match=r"policy must be one of 'adaptive', 'timeout'. Received: policy='eager'"):
        BatchingOptions(policy="eager")
    calls: list[int] = []
    batcher = Batcher(lambda a: calls.append(a["x"].shape[0]) or {"y": a["x"]},
                      BatchingOptions(max_batch_size=4, batch_timeout_micros=50_000, policy="timeout"))
    assert batcher.submit({"x": np.array([1.0])}).result(10)["y"].tolist() == [1.0]
    batcher.close()
    assert calls == [2]
