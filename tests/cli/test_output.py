"""What `tensorfleet` shows, run as users run it (the console script in a child process): the
output they need, none of TensorFlow's start-up or converter noise; all of it with --verbose."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorfleet.cluster.console import is_noise

TENSORFLEET = str(Path(sys.executable).with_name("tensorfleet"))
NOISE = ("Unable to register cuDNN factory", "Unable to register cuFFT factory", "Unable to register cuBLAS factory",
         "fully_quantize:", "UserWarning", "cpu_feature_guard", "TF-TRT Warning",  # TensorFlow 2.14
         "absl::InitializeLog", "oneDNN custom operations", "cudart_stub", "failed call to cuInit")  # 2.21


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG")}
    return subprocess.run([TENSORFLEET, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _visible(stderr: str) -> str:
    """stderr as a terminal would leave it: progress bars that clear themselves (\\r ... \\r) gone."""
    return "\n".join(seg for line in stderr.split("\n") for seg in line.split("\r") if seg.strip())


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_commands_that_start_tensorflow_print_nothing_on_stderr(tmp_path: Path) -> None:
    shown = _run("strategies", "list")
    assert shown.returncode == 0 and shown.stdout.startswith("NAME ")
    assert shown.stderr == ""
    plan = _run("plan", "--model", "digits_cnn", "--batch", "64", "--devices", "2", "--device-memory", "1GB",
                "--bandwidth", "10Gbps")
    assert plan.returncode == 0 and plan.stdout.startswith("digits_cnn: 38.282K parameters")
    assert plan.stderr == ""


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_edge_convert_shows_no_converter_chatter(tmp_path: Path) -> None:
    converted = _run("edge", "convert", "digits_cnn", "-q", "int8", "-o", str(tmp_path / "d.tflite"))
    assert converted.returncode == 0, converted.stderr
    assert converted.stdout.startswith(f"wrote {tmp_path / 'd.tflite'} (")
    visible = _visible(converted.stderr)
    assert [mark for mark in NOISE if mark in visible] == [], visible
    assert [line for line in visible.splitlines() if not line.startswith("calibrating:")] == []


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_verbose_shows_what_is_otherwise_left_out() -> None:
    shown = _run("--verbose", "strategies", "list")
    assert shown.returncode == 0
    # TensorFlow's start-up lines of this release (2.14: the CUDA factories; 2.21: absl, oneDNN, the cudart
    # stub), and at the log level --verbose sets, the CPU-feature line that level 2 hides.
    assert len([line for line in shown.stderr.splitlines() if is_noise(line)]) >= 3, shown.stderr
    assert "cpu_feature_guard" in shown.stderr


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_launched_tasks_show_their_output_without_tensorflows_start_up_lines(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import tensorflow as tf\nprint('ready', tf.__version__)\n")
    launched = _run("launch", "--workers", "1", str(script))
    assert launched.returncode == 0, launched.stdout + launched.stderr
    import tensorflow as tf

    assert launched.stdout.splitlines() == [f"[worker:0] ready {tf.__version__}"]
    assert launched.stderr == ""
    verbose = _run("--verbose", "launch", "--workers", "1", str(script))
    shown = [line.removeprefix("[worker:0] ") for line in verbose.stdout.splitlines()]
    assert any(is_noise(line) for line in shown) and f"ready {tf.__version__}" in shown, verbose.stdout
