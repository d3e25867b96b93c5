"""Validation on the real TFLite Micro interpreter: ops, arena, agreement with desktop TFLite (LiteRT or
tflite_runtime) and Keras."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorfleet import edge
from tensorfleet.edge.micro import ArenaProber, probe_arena, run_micro, run_tflite


@pytest.fixture(scope="module")
def int8_validation(int8_artifact: Any, digits: Any) -> Any:
    return edge.validate_micro(int8_artifact, digits.x_test[:120], digits.y_test[:120], progress=False)


@pytest.mark.slow  # its fixture runs the TFLite Micro checker, a process
def test_int8_on_tflm_agrees_with_desktop_tflite_within_one_quantization_step(int8_validation: Any) -> None:
    # TFLite 2.14's reference kernels (tflite_runtime, the tff track) gave TFLM's outputs bit for bit;
    # LiteRT's and TF 2.21's round a requantization differently now and then: 1 of these 1,200 outputs
    # (and 2 of 2,000 on 200 test digits) one int8 step apart, measured 2026-11-27.
    v = int8_validation
    assert v.num_samples == 120 and v.compared_elements == 1200
    assert v.tflite_interpreter in ("ai_edge_litert", "tflite_runtime", "tensorflow")
    assert v.within_one_step_of_tflite is True
    assert v.max_abs_diff_vs_tflite <= 1.0
    assert v.equal_fraction_vs_tflite >= 0.99
    assert v.bit_identical is (v.mismatched_elements == 0)
    assert v.equal_fraction_vs_tflite == pytest.approx(1 - v.mismatched_elements / 1200)
    line = v.tflite_agreement()
    assert line.startswith(f"120 samples: TFLM vs {v.tflite_interpreter} (reference kernels): ")
    assert line.endswith("bit-identical") if v.bit_identical else (
        f"within one quantization step, {1200 - v.mismatched_elements:,} of 1,200 outputs equal" in line)


@pytest.mark.slow  # its fixture runs the TFLite Micro checker, a process
def test_tflm_is_deterministic_run_against_itself(int8_artifact: Any, int8_validation: Any, digits: Any) -> None:
    first = run_micro(int8_artifact, digits.x_test[:40], arena_bytes=int8_validation.arena_bytes, progress=False)
    again = run_micro(int8_artifact, digits.x_test[:40], arena_bytes=64 * 1024, progress=False)
    assert first.dtype == np.int8 and np.array_equal(first, again)


@pytest.mark.slow  # its fixture runs the TFLite Micro checker, a process
def test_int8_accuracy_drop_against_keras_is_at_most_one_point(int8_validation: Any) -> None:
    v = int8_validation
    assert v.keras_accuracy is not None and v.micro_accuracy is not None
    assert v.keras_accuracy > 0.9
    assert v.accuracy_drop_points == pytest.approx(100 * (v.keras_accuracy - v.micro_accuracy))
    assert v.accuracy_drop_points <= 1.0
    assert v.agreement_with_keras >= 0.98


@pytest.mark.slow
def test_reported_arena_is_the_smallest_that_runs(int8_artifact: Any, int8_validation: Any) -> None:
    arena = int8_validation.arena_bytes
    with ArenaProber(int8_artifact.data) as prober:
        assert prober.probe(arena) == (True, "")
        ok, message = prober.probe(arena - 1)
    assert not ok
    assert "TFLM failed to allocate tensors" in message


@pytest.mark.slow
def test_sine_model_from_the_wheel_needs_exactly_1936_bytes(sine_path: Path) -> None:
    artifact = edge.TFLiteArtifact.from_file(sine_path)
    assert edge.find_arena_size(artifact, progress=False) == 1936
    assert probe_arena(artifact, 1935)[0] is False
    out = run_micro(artifact, np.array([[1.0]], np.float32), arena_bytes=1936, progress=False)
    assert out.shape == (1, 1)
    assert out[0, 0] == pytest.approx(np.sin(1.0), abs=0.05)


@pytest.mark.slow
def test_tflm_allocation_record_of_the_sine_model(sine_path: Path) -> None:
    from tensorfleet.edge.micro import arena_allocations

    alloc = arena_allocations(edge.TFLiteArtifact.from_file(sine_path), 1936)
    assert (alloc["total"], alloc["head"], alloc["tail"]) == (1536, 128, 1408)
    assert alloc["NodeAndRegistration struct"] == 192  # 3 operators
    with pytest.raises(edge.ArenaTooSmallError, match="cannot run the model with arena_bytes=1000"):
        arena_allocations(edge.TFLiteArtifact.from_file(sine_path), 1000)


@pytest.mark.slow
def test_float32_on_tflm_matches_tflite_closely(digits_artifacts: dict[str, Any], digits: Any) -> None:
    v = edge.validate_micro(digits_artifacts["float32"], digits.x_test[:40], digits.y_test[:40], progress=False)
    assert v.max_abs_diff_vs_tflite < 1e-4
    assert v.accuracy_drop_points == 0.0
    assert v.mean_abs_error_vs_keras < 1e-4


def test_int16x8_runs_on_tflm_within_two_int16_steps_of_desktop_tflite(digits_artifacts: dict[str, Any],
                                                                          digits: Any) -> None:
    # Bit-identical with tflite_runtime 2.14; LiteRT's int16 kernels round requantizations differently:
    # a third of the outputs one or two steps apart (of 65,536), measured 2026-11-27.
    artifact = digits_artifacts["int16x8"]
    micro = run_micro(artifact, digits.x_test[:30], arena_bytes=64 * 1024, progress=False)
    desktop = run_tflite(artifact, digits.x_test[:30])
    assert micro.dtype == desktop.dtype == np.int16 and micro.shape == desktop.shape == (30, 10)
    assert np.max(np.abs(micro.astype(np.int32) - desktop.astype(np.int32))) <= 2
    assert np.array_equal(np.argmax(micro, -1), np.argmax(desktop, -1))
    again = run_micro(artifact, digits.x_test[:30], arena_bytes=64 * 1024, progress=False)
    assert np.array_equal(micro, again)


@pytest.mark.slow
def test_a_crashing_probe_does_not_end_the_search(sine_path: Path) -> None:
    # 16 bytes makes the TFLM Python interpreter segfault; the probe runs in a forked child
    with ArenaProber(sine_path.read_bytes()) as prober:
        ok, message = prober.probe(16)
        assert not ok and "TFLM crashed with SIGSEGV" in message
        assert prober.probe(4096) == (True, "")
        assert prober.crashes == 0


# ---- what TFLM cannot run -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_op_tflm_lacks_is_named_with_advice(topk_artifact: Any) -> None:
    with pytest.raises(edge.UnsupportedOpError, match=r"TFLite Micro has no kernel for 1 operator\(s\) of this "
                                                       r"model: TOPK_V2 \(take the arg-max") as info:
        edge.validate_micro(topk_artifact, progress=False)
    assert info.value.ops == ["TOPK_V2"]


@pytest.mark.slow  # its fixture runs the TFLite Micro checker, a process
def test_dynamic_range_model_is_rejected_as_hybrid(digits_artifacts: dict[str, Any]) -> None:
    with pytest.raises(edge.MicroIncompatibleError, match=r"dynamic-range \(hybrid\) ops .* CONV_2D #1, "
                                                          r"FULLY_CONNECTED #4\. TFLite Micro has no hybrid"):
        edge.validate_micro(digits_artifacts["dynamic"], progress=False)


@pytest.mark.slow
def test_float16_model_is_rejected(digits_artifacts: dict[str, Any]) -> None:
    with pytest.raises(edge.MicroIncompatibleError, match=r"stores 8 tensor\(s\) as float16 .* no float16 kernels"):
        edge.check_micro_compatible(digits_artifacts["float16"])


@pytest.mark.slow
def test_arena_too_small_says_what_is_required(int8_artifact: Any, int8_validation: Any) -> None:
    required = int8_validation.arena_bytes
    with pytest.raises(edge.ArenaTooSmallError, match=rf"needs at least {required} bytes .* "
                                                      rf"Received: arena_bytes=4000") as info:
        edge.validate_micro(int8_artifact, arena_bytes=4000, progress=False)
    assert (info.value.required, info.value.received) == (required, 4000)


def test_bad_arguments(int8_artifact: Any, digits: Any) -> None:
    with pytest.raises(ValueError, match=r"arena_bytes must be an integer from 1 to 67108864. Received: arena_bytes=0"):
        edge.validate_micro(int8_artifact, arena_bytes=0)
    with pytest.warns(DeprecationWarning, match=r"validate_micro: 'arena_size' is now 'arena_bytes'"), \
            pytest.raises(ValueError, match=r"Received: arena_bytes=0$"):
        edge.validate_micro(int8_artifact, arena_size=0)  # the older name, for one release
    with pytest.raises(ValueError, match=r"samples must have shape \(n, 8, 8, 1\).*Received: shape=\(3, 64\)"):
        edge.validate_micro(int8_artifact, np.zeros((3, 64)))
    with pytest.raises(ValueError, match=r"labels must have one entry per sample \(3\). Received: 2 labels"):
        edge.validate_micro(int8_artifact, digits.x_test[:3], digits.y_test[:2])
    with pytest.raises(TypeError, match="artifact must be a TFLiteArtifact. Received: bytes"):
        edge.validate_micro(int8_artifact.data)


@pytest.mark.slow
def test_a_users_stdlib_named_file_in_the_working_directory_does_not_break_the_probe(
        sine_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # random (imported by tempfile, which the worker needs) does "from bisect import bisect"
    (tmp_path / "bisect.py").write_text("print('my own bisection script')\n")
    monkeypatch.chdir(tmp_path)
    assert edge.find_arena_size(edge.TFLiteArtifact.from_file(sine_path), progress=False) == 1936
