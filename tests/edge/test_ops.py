"""Which operators TFLite Micro runs: asked of the installed interpreter, and the resolver methods."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorfleet import edge
from tensorfleet.edge import ops
from tensorfleet.edge.micro import run_micro, run_tflite
from tensorfleet.edge.ops import ETHOS_U, MICRO_CUSTOM_OPS, MICRO_OPS, interpreter_lacks

from .conftest import SIGNAL_WINDOW


@pytest.mark.slow
def test_the_op_tables_are_exactly_what_the_installed_interpreter_registers() -> None:
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as fb

    builtins = sorted(k for k, v in vars(fb.BuiltinOperator).items() if not k.startswith("_") and k != "CUSTOM")
    lacking = set(interpreter_lacks([(name, False) for name in builtins]))
    assert sorted(set(builtins) - lacking) == sorted(MICRO_OPS)
    assert interpreter_lacks([(name, True) for name in MICRO_CUSTOM_OPS]) == [ETHOS_U]
    assert interpreter_lacks([("SignalNoSuchOp", True), ("TOPK_V2", False), ("GELU", False)]) == [
        "SignalNoSuchOp", "TOPK_V2", "GELU"]


@pytest.mark.slow
def test_a_signal_library_model_is_accepted_run_and_exported(signal_window_artifact: Any, tmp_path: Path) -> None:
    artifact = signal_window_artifact
    assert artifact.ops == ("SignalWindow",) and artifact.graph.operators[0].custom
    edge.check_micro_compatible(artifact)  # TFLM registers it: no UnsupportedOpError
    assert artifact.quantization == "int16 activations, int16 weights"
    arena = edge.find_arena_size(artifact, progress=False)
    audio = np.array([[1000, -1000, 2000, 300, 32767, -32768, 7, 4095]], np.int16)
    out = run_micro(artifact, audio, arena_bytes=arena, progress=False)
    expected = (audio.astype(np.int32) * SIGNAL_WINDOW) >> 12  # window.cc: (x * w) >> shift
    assert out.dtype == np.int16 and out.tolist() == expected.tolist()
    header = edge.export_c(artifact, tmp_path, "frontend", arena_bytes=arena)[2].read_text()
    assert "using FrontendOpResolver = tflite::MicroMutableOpResolver<1>;" in header
    assert "if (resolver.AddWindow() != kTfLiteOk) return kTfLiteError;  // SignalWindow" in header


@pytest.mark.slow
def test_an_op_the_interpreter_lacks_is_still_refused_by_name(topk_artifact: Any) -> None:
    with pytest.raises(edge.UnsupportedOpError, match=r"no kernel for 1 operator\(s\) of this model: TOPK_V2 "):
        edge.check_micro_compatible(topk_artifact)


# ---- a probe or a worker that stalls is stopped, with a clear error ------------------------------------------


def test_a_probe_that_hangs_is_killed_and_answered_as_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorfleet.edge import _arena_worker as worker

    def hang(*args: Any, **kwargs: Any) -> None:  # what TFLM did once for a one-operator AVERAGE_POOL_2D
        time.sleep(60)

    monkeypatch.setattr(worker, "PROBE_SECONDS", 1)
    monkeypatch.setattr(worker, "_probe", hang)
    start = time.monotonic()
    assert worker._forked_probe(b"", 1024) == f"{worker.TIMED_OUT} 1 s"
    assert worker._registered("builtin ADD") == "timeout"  # asked twice, then reported as neither yes nor no
    assert time.monotonic() - start < 20


@pytest.mark.slow
def test_an_op_check_that_stops_answering_is_stopped_with_its_child(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # a stand-in worker that answers once, then stalls, with a forked probe of its own that sleeps too
    stalls = ("import os, sys, time\n"
              "child = os.fork()\n"
              f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
              "if child:\n    print('yes', flush=True)\n"
              "time.sleep(60)\n")
    monkeypatch.setattr(ops, "safe_python", lambda: [sys.executable, "-c", stalls])
    monkeypatch.setattr(ops, "_REPLY_SECONDS", 2.0)
    with pytest.raises(RuntimeError, match=r"gave no answer for 2 s after 1 of 2; it was stopped"):
        ops._ask_interpreter([("ADD", False), ("MUL", False)])
    assert len(pids.read_text().split()) == 2
    for pid in map(int, pids.read_text().split()):
        assert _dies_within(pid, 10.0), f"process {pid} of the stalled op check is still alive"


def _dies_within(pid: int, seconds: float) -> bool:
    """Whether ``pid`` is gone, or dead and not yet reaped, within ``seconds`` (SIGKILL takes effect
    asynchronously: a busy machine may show a killed process running for a moment)."""
    stat, deadline = Path(f"/proc/{pid}/stat"), time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


# ---- the quantization label, read from the tensors --------------------------------------------------------


@pytest.mark.slow
def test_an_int8_lstm_is_labelled_int8_and_runs_on_tflm(lstm_int8_artifact: Any) -> None:
    artifact = edge.TFLiteArtifact.from_bytes(lstm_int8_artifact.data)  # the label from the bytes alone
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" in artifact.ops
    assert artifact.quantization == "int8"
    meta = artifact.metadata()
    assert (meta["activations"], meta["weights"]) == ("int8", ["int8"])
    x = np.random.default_rng(1).normal(size=(5, 10, 4)).astype(np.float32)
    v = edge.validate_micro(artifact, x, keras_model=lstm_int8_artifact.source_model, progress=False)
    assert v.quantization == "int8"
    # TFLM's int8 LSTM kernel is its own port and rounds a little differently from TFLite's
    # (measured: 1 of 15 outputs one step apart); both stay close to Keras (0.016 at a step of 0.0046)
    assert v.max_abs_diff_vs_tflite <= 1.0 and v.mismatched_elements <= 2
    assert v.mean_abs_error_vs_keras < 0.03


@pytest.mark.slow
def test_an_8_bit_keyword_model_with_int16_features_is_labelled_int8(kws_int16_input_artifact: Any) -> None:
    artifact = kws_int16_input_artifact
    assert artifact.inputs[0].dtype == "int16" and artifact.outputs[0].dtype == "int8"
    assert artifact.ops[:2] == ("QUANTIZE", "CONV_2D")
    assert artifact.quantization == "int8"
    x = np.random.default_rng(2).normal(size=(4, 49, 10, 1)).astype(np.float32)
    micro = run_micro(artifact, x, arena_bytes=edge.find_arena_size(artifact, progress=False), progress=False)
    assert np.array_equal(micro, run_tflite(artifact, x))
