"""What people see of a launched job: Keras' progress bar as readable lines per task, TensorFlow's
start-up noise left out (but kept in the record), and the pieces that do it."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import portpicker
import pytest

from tensorfleet.cluster.console import ProgressLines, is_noise
from tensorfleet.cluster.launcher import TaskCommand, TaskOutput, launch

# Plain Keras 2 fit (the task chooses tf_keras as a user does) with its default progress bar (verbose="auto" is 1 here):
# 2 epochs of 20 steps,
# each step slowed down so that an epoch takes about a second.
KERAS_SCRIPT = textwrap.dedent("""
    import time
    import numpy as np
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # no warning that the slowing callback is slow

    class Slow(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.05)

    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    model.compile("sgd", "mse")
    model.fit(np.zeros((40, 2)), np.zeros((40, 1)), batch_size=2, epochs=2, callbacks=[Slow()])
    print("done")
""")

FINAL = re.compile(r"^20/20 \[==============================\] - \d+s \d+ms/step - loss: 0\.0000e\+00$")


@pytest.mark.slow
def test_a_launched_keras_fit_shows_its_progress_as_lines_per_task(tmp_path: Path) -> None:
    script = tmp_path / "fit.py"
    script.write_text(KERAS_SCRIPT)
    shown: list[str] = []
    result = launch(script, workers=1, ports=[portpicker.pick_unused_port()],
                    output=TaskOutput(log=shown.append, progress_interval=0.3),
                    command=TaskCommand(env={"TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1"}))
    assert result.returncode == 0
    task_lines = [line[len("[worker:0] "):] for line in shown if line.startswith("[worker:0] ")]
    assert all("\r" not in line and "\b" not in line and len(line) < 200 for line in task_lines), task_lines
    # The record holds each epoch's final state once, as the last line of that epoch.
    recorded = [line.text for line in result.lines]
    assert [line for line in recorded if line.startswith("Epoch ")] == ["Epoch 1/2", "Epoch 2/2"]
    assert len([line for line in recorded if FINAL.match(line)]) == 2, recorded
    assert recorded[-1] == "done"
    # Between them, the bar's state at most every 0.3 s: a few lines per epoch, not one per step.
    states = [line for line in task_lines if re.match(r"^\d+/20 \[", line) and not FINAL.match(line)]
    assert 1 <= len(states) <= 12, states
    assert all(re.match(r"^\d+/20 \[[=>.]{30}\] - ETA: \d+s - loss: 0\.0000e\+00$", s) for s in states), states
    # TensorFlow's start-up lines (2.14: CUDA factories; 2.21: absl, oneDNN, cudart, cuInit) are not
    # shown, and stay in the record: what the record holds beyond the shown lines is that noise.
    assert not any(is_noise(line) for line in task_lines)
    hidden = [line for line in recorded if line not in task_lines]
    assert hidden and all(is_noise(line) for line in hidden), hidden



@pytest.mark.parametrize(("chunks", "expected"), [
    (["a\r", "b\r", "c\r", "\n"], [("a", False), ("c", False), ("c", True)]),
    (["\b\b\r1/3 [=", "=>] x", "\b\b\b\r3/3 done\n"], [("1/3 [=", False), ("3/3 done", True)]),  # 0.8 s < 1 s
    (["plain\nmore"], [("plain", True), ("more", True)]),
    (["x" * 5 + "y" * 3], [("xxxxx", True), ("yyy", True)]),
])
def test_progress_lines_collapse_redraws_at_a_bounded_rate(chunks: list[str], expected: list) -> None:
    progress = ProgressLines(interval=1.0, limit=5)
    out = []
    for i, chunk in enumerate(chunks):
        out += progress.feed(chunk, now=0.8 * i)
    assert out + progress.flush() == expected


def test_noise_is_only_tensorflows_known_lines() -> None:
    assert is_noise("2026-11-23 14:20:22.950590: E tensorflow/compiler/xla/stream_executor/cuda/cuda_fft.cc:609] "
                    "Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT when one has "
                    "already been registered")
    assert is_noise("fully_quantize: 0, inference_type: 6, input_inference_type: INT8, output_inference_type: INT8")
    assert not is_noise("2026-11-23 14:20:22.950590: E tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc:1] "
                        "Unable to bind 127.0.0.1:2222")
    assert not is_noise("Unable to register cuFFT factory")


def test_quiet_stderr_drops_noise_written_to_the_file_descriptor_and_passes_the_rest(capfd) -> None:
    import os
    import warnings

    from tensorfleet.cluster.console import quiet_stderr

    noise = ("2026-11-23 14:20:22.950590: E tensorflow/compiler/xla/stream_executor/cuda/cuda_fft.cc:609] Unable to "
             "register cuFFT factory: Attempting to register factory for plugin cuFFT when one has already been "
             "registered\n")
    with quiet_stderr():
        os.write(2, noise.encode() + b"kept\n\rbar 1/2\rbar 2/2\rfully_quantize: 0, inference_type: 6, "
                 b"input_inference_type: INT8, output_inference_type: INT8\nend without newline")
        warnings.warn("Statistics for quantized inputs were expected, but not specified; continuing anyway.")
    assert capfd.readouterr().err == "kept\n\rbar 1/2\rbar 2/2\rend without newline"
    with quiet_stderr(enabled=False):
        os.write(2, noise.encode())
    assert capfd.readouterr().err == noise


# TensorFlow 2.21's start-up lines on a machine without a GPU, as printed (TF_CPP_MIN_LOG_LEVEL=2 keeps
# all but the cpu_feature_guard pair), and lines like them that must stay.
@pytest.mark.parametrize(("line", "noise"), [
    ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", True),
    ("I0000 00:00:1795791300.870477    7002 port.cc:153] oneDNN custom operations are on. You may see slightly "
     "different numerical results due to floating-point round-off errors from different computation orders. To turn "
     "them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.", True),
    ("I0000 00:00:1795791300.870788    7002 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
     "not be used.", True),
    ("E0000 00:00:1795791305.987977    7002 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed "
     "call to cuInit: UNKNOWN ERROR (303)", True),
    ("I0000 00:00:1795791892.128163   30349 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
     "available CPU instructions in performance-critical operations.", True),
    ("To enable the following instructions: AVX2 AVX512F AVX512_VNNI FMA, in other operations, rebuild TensorFlow "
     "with the appropriate compiler flags.", True),
    # a GPU machine whose driver fails: a real error
    ("E0000 00:00:1795791305.987977    7002 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed "
     "call to cuInit: CUDA_ERROR_OUT_OF_MEMORY: out of memory", False),
    ("E0000 00:00:1795791305.987977    7002 grpc_server_lib.cc:1] Unable to bind 127.0.0.1:2222", False),
    ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR, and more", False),
])
def test_tensorflow_2_21_start_up_lines_are_noise_and_errors_are_not(line: str, noise: bool) -> None:
    assert is_noise(line) is noise


@pytest.mark.parametrize(("line", "noise"), [
    ("Starting to trace for 2000 ms. Remaining attempt(s): 2", True),
    ("Starting to trace for 2000 ms. Remaining attempt(s): 2 and more", False),
    ("[worker:0] Starting training", False),
])
def test_the_profiler_clients_trace_line_is_noise(line: str, noise: bool) -> None:
    assert is_noise(line) is noise
