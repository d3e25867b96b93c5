"""Elastic serving: the scaling rule with numbers alone, then a real pool of replica processes
that grows while calls queue for a replica and shrinks when idle, every event logged and plotted."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tensorfleet.serving.elastic import Autoscaler, decide

from .conftest import FLOAT32_RTOL


def test_the_rule_needs_a_streak_and_keeps_the_bounds():
    rule = dict(minimum=1, maximum=2, target_wait=0.01, up_after=2, down_after=3)
    assert decide([0.05], 1, hot=0, idle=0, **rule) == (0, 1, 0)  # one slow interval is not enough
    assert decide([0.05], 1, hot=1, idle=0, **rule) == (1, 0, 0)
    assert decide([0.05], 2, hot=5, idle=0, **rule) == (0, 6, 0)  # already at the maximum
    assert decide([], 2, hot=0, idle=2, **rule) == (-1, 0, 0)
    assert decide([], 1, hot=0, idle=9, **rule) == (0, 0, 10)  # already at the minimum
    assert decide([0.001, 0.012, 0.002], 1, hot=1, idle=0, **rule) == (0, 0, 0)  # the mean is under target


def test_bounds_are_checked():
    with pytest.raises(ValueError, match=r"max_replicas must be an integer >= 3. Received: max_replicas=2"):
        Autoscaler(object(), min_replicas=3, max_replicas=2)


@pytest.mark.slow
def test_a_pool_grows_under_queueing_and_shrinks_when_idle(model_base, digits_models, images, tmp_path):
    from tensorfleet.serving.replicas import ReplicaPool

    log: list[str] = []
    pool = ReplicaPool("digits", 2, model_base / "2", replicas=1, intra_op_threads=1)
    scaler = Autoscaler(pool, min_replicas=1, max_replicas=2, target_wait=0.001, interval=0.3, up_after=2,
                        down_after=3, log=log.append).start()
    expected = digits_models[2].predict(images[:32], verbose=0)
    stop, wrong = threading.Event(), []

    def caller() -> None:
        while not stop.is_set():
            out = pool.run("serving_default", {"image": images[:32]})["logits"]
            if not np.allclose(out, expected, rtol=FLOAT32_RTOL, atol=FLOAT32_RTOL * np.abs(expected).max()):
                wrong.append(out)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 90
        while pool.size < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.size == 2 and len(set(pool.pids())) == 2
        stop.set()
        for thread in threads:
            thread.join(30)
        deadline = time.monotonic() + 30
        while pool.size > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.size == 1
    finally:
        stop.set()
        scaler.stop()
        pool.close()
    assert wrong == []
    assert [(e.before, e.after) for e in scaler.events] == [(1, 2), (2, 1)]
    assert scaler.events[0].reason.startswith("mean wait for a replica ")
    assert scaler.events[1].reason == "no request for 3 intervals"
    assert [line.split(":")[0] for line in log] == ["scaled 'digits' v2 from 1 to 2 replicas",
                                                    "scaled 'digits' v2 from 2 to 1 replicas"]
    assert scaler.plot(tmp_path / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
