"""Two MultiWorkerMirrored workers in real processes, one slowed on purpose: the analysis names it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tensorfleet.strategies.tf_config import ClusterSpec

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 150
SLOW_SECONDS = 0.2


@pytest.fixture(scope="module")
def job_profile(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("profile")
    spec = ClusterSpec.local(workers=2)
    procs = []
    try:
        for index in range(2):
            env = {**os.environ, "TF_CONFIG": spec.tf_config_json("worker", index),
                   "TENSORFLEET_PROFILE_STEPS": "3-8", "TENSORFLEET_PROFILE_DIR": str(logdir),
                   "SLEEP_SECONDS": str(SLOW_SECONDS if index == 1 else 0)}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.profiling.slow_worker_job"], cwd=ROOT, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        logs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for index, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"worker {index} exited {p.returncode}:\n{log[-3000:]}"
    return logdir


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_each_worker_records_into_its_own_directory(job_profile):
    from tensorfleet.profiling.xspace import find_traces, task_traces

    assert sorted(find_traces(job_profile)) == ["worker-0", "worker-1"]
    for trace in task_traces(job_profile):
        assert [s.number for s in trace.steps] == [3, 4, 5, 6, 7, 8]


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_the_slowed_worker_is_named_the_straggler(job_profile):
    from tensorfleet import profiling

    profile = profiling.analyze(job_profile)
    verdict = profile.verdict
    assert verdict.bottleneck is profiling.Bottleneck.STRAGGLER
    assert verdict.straggler == "worker-1"
    assert verdict.advice.startswith("the slow worker is worker-1: its input pipeline waits for data")
    healthy, slow = profile.tasks
    # Keras splits each 16-example batch between the 2 replicas, so the sleep falls on every other
    # step: 100 ms per step on average. The healthy worker spends it waiting inside the all-reduce.
    assert slow.input_ms > 0.3 * SLOW_SECONDS * 1000 > healthy.input_ms
    assert healthy.exposed_communication_ms > 0.3 * SLOW_SECONDS * 1000 > slow.exposed_communication_ms
    assert healthy.collectives >= 1 and slow.collectives >= 1
