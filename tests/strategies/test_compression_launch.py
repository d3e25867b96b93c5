"""PowerSGD across two worker processes started by ``tensorfleet launch --workers 2`` (127.0.0.1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_workers, user_env


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_powersgd_workers_send_the_counted_bytes_and_stay_in_step(tmp_path: Path) -> None:
    launcher = str(Path(sys.executable).with_name("tensorfleet"))
    job = str(Path(__file__).with_name("compression_job.py"))
    run_workers([[launcher, "launch", "--workers", "2", job, "--", "powersgd:rank=2", str(tmp_path)]], [user_env()],
                timeout=540)
    results = [np.load(tmp_path / f"worker{i}.npz") for i in range(2)]
    for result in results:
        traffic = json.loads(str(result["traffic"]))
        # the biases (122 values) beside the four Ps, then the four Qs: float32 (test_compression.py's arithmetic)
        assert (traffic["calls"], traffic["gradient_bytes"]) == ([6320, 976], 153128)
        assert result["moved"].all()
    # Each worker keeps its own error, but both apply the same reduced gradient: the same weights.
    for i in range(8):
        np.testing.assert_allclose(results[0][f"arr_{i}"], results[1][f"arr_{i}"], rtol=0, atol=1e-6)
