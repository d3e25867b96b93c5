"""Two migratable jobs sharing this machine's devices by time slices at step boundaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorfleet.cluster.migration import MigrationError, Placement, RunOptions
from tensorfleet.cluster.multiplex import SharedJob, share

JOB = Path(__file__).parent / "migrating_job.py"
RUN = RunOptions(epochs=2, global_batch_size=8)  # 24 steps a job


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_jobs_get_their_shares_of_steps_and_the_survivor_takes_the_rest(tmp_path: Path) -> None:
    from tensorfleet.cluster.jobstate import read_state

    jobs = [SharedJob(JOB, tmp_path / "a", Placement("mirrored"), RUN, share=0.75),
            SharedJob(JOB, tmp_path / "b", Placement("mirrored"), RUN, share=0.25)]
    result = share(jobs, quantum=4, timeout=300)
    assert [r.returncode for r in result.results] == [0, 0]
    assert [len(times) for times in result.steps] == [24, 24]
    assert [read_state(tmp_path / d)[0].step for d in ("a", "b")] == [24, 24]
    shares = result.shares()
    assert abs(shares[0] - 0.75) <= 0.05 and abs(shares[1] - 0.25) <= 0.05, shares
    # Job a ends first; b's remaining steps then run back to back (its slices are no longer shared).
    a_end = result.steps[0][-1]
    assert sum(t > a_end for t in result.steps[1]) >= 24 - 24 // 3 - 1
    png = result.plot(tmp_path / "timeline.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("shares", "message"), [
    ((0.5, 0.6),
     r"The jobs' shares must each be between 0 and 1 and sum to 1. Received: shares=\[0.5, 0.6\] \(sum 1.1\)"),
    ((1.0,), r"Sharing devices needs at least two jobs. Received: 1 job\(s\)"),
    ((0.0, 1.0), r"Received: shares=\[0.0, 1.0\]"),
])
def test_shares_that_do_not_sum_are_refused_before_anything_starts(tmp_path: Path, shares, message) -> None:
    jobs = [SharedJob(JOB, tmp_path / str(i), Placement("mirrored"), RUN, share=s) for i, s in enumerate(shares)]
    with pytest.raises(MigrationError, match=message):
        share(jobs)
    assert list(tmp_path.iterdir()) == []
