"""Measured communication set beside the planner's prediction (numbers only, no trace)."""

from __future__ import annotations

import pytest

from tensorfleet.planner.cost_model import Link
from tensorfleet.profiling.breakdown import Bottleneck, JobProfile, StepBreakdown, Verdict
from tensorfleet.profiling.planned import compare, measured_communication_ms


def _row(task: str, step: int, communication: float, step_ms: float, device: str = "/host:CPU") -> StepBreakdown:
    return StepBreakdown(task=task, device=device, step=step, step_ms=step_ms, compute_ms=1.0,
                         exposed_communication_ms=communication, input_ms=0.0, idle_ms=step_ms - 1 - communication,
                         communication_ms=communication, overlap_ms=0.0, collectives=2)


def _profile(rows: list[StepBreakdown]) -> JobProfile:
    return JobProfile(None, rows, [], Verdict(Bottleneck.COMMUNICATION, "", ""), [])


def test_the_least_communication_among_workers_is_taken_per_step_then_the_median():
    rows = [_row("worker-0", 1, 30.0, 50.0), _row("worker-1", 1, 5.0, 52.0),
            _row("worker-0", 2, 31.0, 50.0), _row("worker-1", 2, 7.0, 50.0),
            _row("worker-0", 3, 4.0, 48.0), _row("worker-1", 3, 29.0, 49.0),
            _row("worker-0", 3, 99.0, 48.0, device="/device:GPU:0")]  # only the host device counts
    assert measured_communication_ms(_profile(rows)) == (5.0, 50.0)


def test_compare_predicts_the_ring_all_reduce_from_the_link():
    rows = [_row("worker-0", 1, 20.0, 80.0), _row("worker-1", 1, 15.0, 80.0)]
    link = Link.from_strings(latency="1ms", bandwidth="0.33GB/s")
    check = compare(_profile(rows), gradient_bytes=4e6, workers=2, link=link)
    # ring on 2 workers: a reduce-scatter and an all-gather step of half the bytes each
    assert check.predicted_ms == pytest.approx(2 * (1.0 + 2e6 / 0.33e9 * 1e3))
    assert (check.measured_ms, check.step_ms, check.measured_share) == (15.0, 80.0, 0.1875)
    assert check.error == pytest.approx(15.0 / check.predicted_ms - 1)
    with pytest.raises(ValueError, match=r"^workers must be a positive integer. Received: workers=0$"):
        compare(_profile(rows), gradient_bytes=4e6, workers=0, link=link)
    with pytest.raises(ValueError, match=r"^The profile holds no step to measure communication in.$"):
        compare(_profile([]), gradient_bytes=4e6, workers=2, link=link)
