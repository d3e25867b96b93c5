"""The adaptive batcher on the real digits CNN (a loaded SavedModel signature): a lone caller's
request goes at once and alone; requests that queue while a batch runs go together as the next
batch, and the load they showed is what later batches gather for; under a closed loop of many
callers every request is run exactly once and each caller gets back exactly its own rows, in
order. No timing is asserted: "at once" is shown by a batch timeout of 60 s that no answer waits for."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tensorfleet.serving.batching import PEAK_BATCHES, Batcher, BatchingOptions

from .conftest import assert_float32_close

HOUR_LONG = 60_000_000  # batch_timeout_micros no test waits out: an answer within 30 s did not wait for it


@pytest.fixture(scope="module")
def servable(model_base):
    from tensorfleet.serving.servable import Servable

    return Servable("digits", 2, model_base / "2")


@pytest.fixture(scope="module")
def expected(digits_models, images):
    return digits_models[2].predict(images, verbose=0)


class Recorder:
    """The signature call the batcher makes, recording each call's rows and its non-padding rows
    (digits images are never all zeros; padding rows are), optionally held until released."""

    def __init__(self, servable) -> None:
        self.servable = servable
        self.sizes: list[int] = []
        self.real_rows = 0
        self.hold_first = threading.Event()
        self.first_runs = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, arrays):
        image = arrays["image"]
        self.sizes.append(image.shape[0])
        self.real_rows += int(np.count_nonzero(image.reshape(image.shape[0], -1).any(axis=1)))
        if len(self.sizes) == 1:
            self.first_runs.set()
            self.release.wait(30)
        return self.servable.run("serving_default", arrays)


def test_a_lone_caller_is_answered_at_once_alone_and_as_a_per_request_call(servable, expected, images):
    record = Recorder(servable)
    batcher = Batcher(record, BatchingOptions(max_batch_size=16, batch_timeout_micros=HOUR_LONG, num_batch_threads=1))
    try:
        answers = [batcher.submit({"image": images[i:i + 1]}).result(30)["logits"] for i in range(12)]
    finally:
        batcher.close()
    assert record.sizes == [1] * 12  # one call per request, unpadded, none waiting for a companion
    assert batcher.load == 1 and batcher.batches == 12
    for i, answer in enumerate(answers):
        assert_float32_close(answer, servable.run("serving_default", {"image": images[i:i + 1]})["logits"])
        assert_float32_close(answer, expected[i:i + 1])


def test_requests_that_queue_while_a_batch_runs_go_together_and_set_the_load(servable, expected, images):
    record = Recorder(servable)
    record.release.clear()
    batcher = Batcher(record, BatchingOptions(max_batch_size=16, batch_timeout_micros=HOUR_LONG, num_batch_threads=1))
    try:
        first = batcher.submit({"image": images[:1]})
        assert record.first_runs.wait(30)
        queued = [batcher.submit({"image": images[i:i + 1 + i % 2]}) for i in range(1, 9)]  # 12 rows
        record.release.set()
        answers = [first.result(30), *(f.result(30) for f in queued)]
        assert batcher.load == 13  # 1 row running and 12 queued: the most in flight at once
        # a lone caller since: the load falls back to 1 once the batches that saw the 12 rows in flight
        # (the 12-row batch itself and the first lone row, taken while it ran) have left the window
        for _ in range(PEAK_BATCHES + 1):
            batcher.submit({"image": images[40:41]}).result(30)
    finally:
        record.release.set()
        batcher.close()
    assert record.sizes[:2] == [1, 16]  # the lone first row, then the 12 queued rows padded to 16
    assert batcher.load == 1
    assert_float32_close(answers[0]["logits"], expected[:1])
    for i, answer in enumerate(answers[1:], start=1):
        assert_float32_close(answer["logits"], expected[i:i + 1 + i % 2])


def test_a_closed_loop_of_callers_is_batched_and_every_request_answered_once_with_its_own_rows(
        servable, expected, images):
    callers, per_caller = 12, 16
    record = Recorder(servable)
    batcher = Batcher(record, BatchingOptions(max_batch_size=16, batch_timeout_micros=HOUR_LONG, num_batch_threads=1))
    start = threading.Barrier(callers)

    def caller(c):
        start.wait(30)
        got = []
        for i in range(per_caller):  # requests of 1 to 3 rows, each caller its own rows
            rows = slice((c * 5 + i) % 60, (c * 5 + i) % 60 + 1 + (c + i) % 3)
            got.append((rows, batcher.submit({"image": images[rows]}).result(30)["logits"]))
        return got

    try:
        with ThreadPoolExecutor(callers) as pool:
            results = [r for got in pool.map(caller, range(callers)) for r in got]
    finally:
        batcher.close()
    assert len(results) == callers * per_caller
    for rows, logits in results:
        assert_float32_close(logits, expected[rows])
    submitted = sum(r.stop - r.start for r, _ in results)
    assert record.real_rows == submitted  # no request lost, none run twice
    assert batcher.batches == len(record.sizes) < callers * per_caller  # fewer calls than requests
    assert set(record.sizes) <= {1, 2, 4, 8, 16} and sum(record.sizes) >= submitted
    assert batcher.queue_depth == 0 and batcher.load <= 16
