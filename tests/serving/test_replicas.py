"""Replicas: worker processes answer what the model does (to float32 rounding); a replica killed under load is
restarted, its calls are retried on another, and no request fails or is lost."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tensorfleet.serving.batching import BatchingOptions

from .conftest import assert_float32_close, start_server


@pytest.fixture(scope="module")
def replica_server(model_base):
    from tensorfleet.serving import ScalingOptions

    server = start_server(model_base, scaling=ScalingOptions(replicas=2),
                          batching=BatchingOptions(max_batch_size=8, batch_timeout_micros=2000, num_batch_threads=2))
    yield server
    server.stop()


def _predict(server, rows: np.ndarray) -> np.ndarray:
    body = json.dumps({"instances": rows.tolist()}).encode()
    url = f"http://127.0.0.1:{server.rest_api_port}/v1/models/digits:predict"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=60) as reply:
        assert reply.status == 200
        return np.array(json.loads(reply.read())["predictions"], dtype=np.float32)


@pytest.mark.slow
def test_replicas_answer_the_models_own_outputs(replica_server, digits_models, images):
    pool = replica_server.predictor.pools[2]
    assert len(set(pool.pids())) == 2 and os.getpid() not in pool.pids()
    expected = digits_models[2].predict(images, verbose=0)
    with ThreadPoolExecutor(8) as workers:
        results = list(workers.map(lambda i: _predict(replica_server, images[i * 4:i * 4 + 4]), range(16)))
    for i, result in enumerate(results):
        assert_float32_close(result, expected[i * 4:i * 4 + 4])
    assert pool.calls >= 1 and replica_server.repository.get("digits").calls == 0  # nothing ran in the front


@pytest.mark.slow
def test_a_replica_killed_under_load_loses_no_request(replica_server, digits_models, images):
    pool = replica_server.predictor.pools[2]
    expected = digits_models[2].predict(images, verbose=0)
    before, restarts, retries = pool.pids(), pool.restarts, pool.retries
    results: dict[int, tuple[np.ndarray, int]] = {}
    errors: list[BaseException] = []
    done = threading.Event()

    def caller(k: int) -> None:
        n = 0
        while not done.is_set():
            i = (k * 7 + n) % 60
            try:
                results[k * 10_000 + n] = (_predict(replica_server, images[i:i + 3]), i)
            except BaseException as exc:  # noqa: BLE001 - every failure is reported below
                errors.append(exc)
            n += 1

    def answered(count: int) -> None:  # waits on the answers the callers record, at most a minute
        deadline = time.monotonic() + 60
        while len(results) < count and not errors and time.monotonic() < deadline:
            time.sleep(0.01)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    answered(12)  # the load is on: every caller has had calls answered
    os.kill(before[0], signal.SIGKILL)
    answered(len(results) + 12)  # and calls go on being answered after the kill
    done.set()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(results) >= 24
    for result, i in results.values():
        assert_float32_close(result, expected[i:i + 3])
    deadline = time.monotonic() + 60
    while pool.restarts == restarts and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pool.restarts == restarts + 1 and pool.retries >= retries + 1  # the dead replica's call ran again
    after = pool.pids()
    assert after[0] != before[0] and after[1] == before[1]
    assert_float32_close(_predict(replica_server, images[:5]), expected[:5])
