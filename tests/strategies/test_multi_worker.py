"""MultiWorkerMirrored across 2 real processes on 127.0.0.1 (ports from portpicker)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from tensorfleet.strategies.tf_config import ClusterSpec
from tests.conftest import run_workers

TIMEOUT = 240


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("mwms")
    spec = ClusterSpec.local(workers=2)
    run_workers([[sys.executable, "-m", "tests.strategies.mwms_job", str(out / f"worker{index}.json")]
                 for index in range(2)],
                [{**os.environ, "TF_CONFIG": spec.tf_config_json("worker", index)} for index in range(2)],
                timeout=TIMEOUT)
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
