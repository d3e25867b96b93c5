"""examples/profile_digits.py run alone, as a user would: a slowed input pipeline is found and named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_example_alone_records_its_steps_and_judges_the_slowed_input(tmp_path):
    # 100 ms of sleep per batch: with 40 ms, a loaded 2-core machine (ops slowed to 15-23 ms a step, and
    # TensorFlow 2.21 preparing the next batch during the step) showed the job compute-bound.
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TENSORFLEET_PROFILE_STEPS")}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "profile_digits.py"), "--epochs", "1",
                           "--steps-per-epoch", "14", "--profile-steps", "3-12", "--input-delay-ms", "100",
                           "--profile-dir", str(tmp_path / "prof")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[2].split()[:3] == ["local", "trainer", "9"]
    assert "verdict: input-bound" in lines
    assert lines[-1] == (f"wrote {tmp_path / 'prof' / 'profile.json'}, {tmp_path / 'prof' / 'profile.png'} and "
                         f"{tmp_path / 'prof' / 'trace.json'}")
