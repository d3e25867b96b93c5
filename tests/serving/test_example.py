"""examples/serve_digits.py runs end to end: both protocols answer as model.predict (to float32 rounding), in
fewer signature calls than requests, and a version exported while serving takes over."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import reap, user_env

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "serve_digits.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_serve_digits_answers_both_protocols_and_switches_versions(tmp_path):
    process = subprocess.Popen([sys.executable, str(SCRIPT), "--epochs", "1", "--out", str(tmp_path)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=user_env(TF_CPP_MIN_LOG_LEVEL="3"))  # as a user runs it: Keras 3
    try:
        out, err = process.communicate(timeout=240)
    finally:
        reap(process)
    assert process.returncode == 0, out[-2000:] + err[-3000:]
    first = re.search(r"version 1: 16 concurrent requests \(8 REST, 8 gRPC\) answered as model.predict "
                      r"\(to float32 rounding\), "
                      r"served accuracy (0\.\d{3}), in (\d+) signature call\(s\)", out)
    assert first and int(first[2]) < 16, out
    assert re.search(r"version 2: served after the switch \(versions \[2\]\), accuracy 0\.\d{3}", out), out
    assert "[serve] version 1 unloaded" in out
