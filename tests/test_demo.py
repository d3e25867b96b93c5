"""`make demo`'s job runs end to end (in a child process: it splits the CPU itself)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_demo_trains_simulates_and_exports(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "tensorfleet.demo", "--epochs", "2", "--rounds", "2", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=380,
        # A user's process: TensorFlow's default Keras (Keras 3 on 2.21), none of the suite's settings.
        env={**{k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS")},
             "TF_CONFIG": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # What the user sees has none of TensorFlow's start-up or converter noise.
    for noise in ("Unable to register cu", "fully_quantize:", "UserWarning", "cpu_feature_guard", "absl::InitializeLog",
                  "oneDNN custom operations", "cudart_stub", "failed call to cuInit"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
    text = proc.stdout.replace("\r", "\n")
    import platform

    import tensorflow as tf

    assert text.startswith(f"tensorfleet demo on Python {platform.python_version()}, "
                           f"TensorFlow {tf.__version__}, "), text
    keras = "Keras 3" if int(tf.__version__.split(".")[1]) >= 16 else "Keras 2"  # what tf.keras is by default
    assert re.match(rf"^tensorfleet demo on .*, {keras}\.\d+\.\d+ \(tf\.keras\)$", text.splitlines()[0]), text
    assert "strategy: mirrored over 2 logical CPU devices" in text
    accuracy = float(re.search(r"^test accuracy: ([0-9.]+)$", text, re.M).group(1))
    assert accuracy >= 0.9
    assert re.search(r"^federated: fedavg on compiled, 20 clients, 5 per round, 2 rounds: central test accuracy", text,
                     re.M)
    assert re.search(r"edge: int8 model [0-9,]+ bytes, smallest TFLite Micro arena [0-9,]+ bytes", text)
    for name in ("federated/metrics.json", "federated/accuracy.png", "edge/digits_int8.tflite",
                 "edge/c/digits_model_data.cc", "edge/c/digits_op_resolver.h"):
        assert (out / name).stat().st_size > 0, name
