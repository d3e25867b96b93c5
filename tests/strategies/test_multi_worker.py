"""MultiWorkerMirrored across 2 real processes on 127.0.0.1 (ports from portpicker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorfleet.strategies.tf_config import ClusterSpec

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("mwms")
    spec = ClusterSpec.local(workers=2)
    procs = []
    try:
        for index in range(2):
            env = {**os.environ, "TF_CONFIG": spec.tf_config_json("worker", index)}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.strategies.mwms_job", str(out / f"worker{index}.json")],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,
            ))
        logs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for index, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"worker {index} exited {p.returncode}:\n{log[-3000:]}"
    return [json.loads((out / f"worker{i}.json").read_text()) for i in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_two_workers_train_digits_to_90_percent_with_plain_fit(worker_results) -> None:
    for index, result in enumerate(worker_results):
        assert result["task"] == {"type": "worker", "index": index}
        assert result["replicas"] == 2
        assert result["test_accuracy"] >= 0.90
        assert result["evaluate"]["accuracy"] >= 0.90
        assert result["reload_max_abs_diff"] <= 1e-5


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_both_workers_end_with_identical_weights(worker_results) -> None:
    first, second = worker_results
    assert len(first["weights"]) == len(second["weights"]) == 8
    for a, b in zip(first["weights"], second["weights"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
