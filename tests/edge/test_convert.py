"""Conversion: the five modes, the artifact's metadata, int8 verification and bad input."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorfleet import edge
from tensorfleet.edge.artifact import infer_quantization

DIGITS_OPS = ("CONV_2D", "CONV_2D", "MAX_POOL_2D", "RESHAPE", "FULLY_CONNECTED", "FULLY_CONNECTED")


def test_int8_has_int8_inputs_outputs_and_input_scale_of_unit_range(int8_artifact: Any) -> None:
    (inp,), (out,) = int8_artifact.inputs, int8_artifact.outputs
    assert (inp.dtype, out.dtype) == ("int8", "int8")
    assert inp.shape == (1, 8, 8, 1) and out.shape == (1, 10)
    # digits pixels span [0, 1]: the calibrated input scale is 1/255 with zero point -128
    assert inp.scales[0] == pytest.approx(1 / 255, rel=1e-6)
    assert inp.zero_points == (-128,)
    assert int8_artifact.ops == DIGITS_OPS
    assert int8_artifact.op_types == ("CONV_2D", "FULLY_CONNECTED", "MAX_POOL_2D", "RESHAPE")
    edge.verify_int8(int8_artifact)  # raises if anything is not int8


def test_every_mode_is_recognised_from_its_bytes_alone(digits_artifacts: dict[str, Any]) -> None:
    for mode, artifact in digits_artifacts.items():
        assert artifact.quantization == mode
        assert edge.TFLiteArtifact.from_bytes(artifact.data).quantization == mode
        assert infer_quantization(artifact.graph) == mode


def test_mode_sizes_relative_to_float32(digits_artifacts: dict[str, Any]) -> None:
    sizes = {mode: a.size for mode, a in digits_artifacts.items()}
    # 38,284 parameters: float32 ~4 bytes each, float16 ~2, the int8 modes ~1
    assert sizes["float32"] > 38_284 * 4
    assert 0.45 < sizes["float16"] / sizes["float32"] < 0.55
    for mode in ("dynamic", "int8", "int16x8"):
        assert 0.25 < sizes[mode] / sizes["float32"] < 0.30, (mode, sizes)


def test_dynamic_and_float16_keep_float_io(digits_artifacts: dict[str, Any]) -> None:
    for mode in ("float32", "dynamic", "float16"):
        assert digits_artifacts[mode].inputs[0].dtype == "float32"
    assert digits_artifacts["int16x8"].inputs[0].dtype == "int16"
    assert "DEQUANTIZE" in digits_artifacts["float16"].ops


def test_metadata_lists_dtypes_scales_and_ops(int8_artifact: Any) -> None:
    meta = int8_artifact.metadata()
    assert meta["bytes"] == int8_artifact.size
    assert meta["quantization"] == "int8"
    assert meta["inputs"][0]["dtype"] == "int8" and meta["inputs"][0]["zero_points"] == [-128]
    assert meta["ops"] == list(DIGITS_OPS)


def test_verify_int8_names_the_float_tensors(digits_artifacts: dict[str, Any]) -> None:
    with pytest.raises(edge.QuantizationError, match=r"input 'serving_default_image:0' is float32") as info:
        edge.verify_int8(digits_artifacts["float32"])
    # The output's name is the converter's: StatefulPartitionedCall:0 from tf_keras, ..._1:0 from Keras 3.
    assert re.search(r"output 'StatefulPartitionedCall(_1)?:0' is float32", str(info.value)), str(info.value)
    assert "quantization='int8'" in str(info.value)


def test_sine_model_from_the_tflite_micro_wheel_parses(sine_path: Path) -> None:
    artifact = edge.TFLiteArtifact.from_file(sine_path)
    assert artifact.size == sine_path.stat().st_size
    assert artifact.ops == ("FULLY_CONNECTED", "FULLY_CONNECTED", "FULLY_CONNECTED")
    assert artifact.quantization == "float32"
    assert artifact.inputs[0].dtype == "float32" and artifact.inputs[0].shape == (1, 1)


def test_quantize_and_dequantize_round_trip(int8_artifact: Any) -> None:
    x = np.array([[0.0, 1.0, 0.2, 2.0]], np.float32).reshape(1, 4, 1, 1)
    # 0.2 * 255 = 51 steps above -128; 2.0 is out of range and saturates at 127
    assert int8_artifact.quantize_input(x).ravel().tolist() == [-128, 127, -77, 127]
    out = int8_artifact.outputs[0]
    raw = np.array([out.zero_points[0], out.zero_points[0] + 10], np.int8)
    assert int8_artifact.dequantize_output(raw).tolist() == pytest.approx([0.0, 10 * out.scales[0]])


# ---- bad input --------------------------------------------------------------------------------------------


def test_unknown_mode_lists_modes_and_suggests(digits_model: Any) -> None:
    with pytest.raises(ValueError, match=r"Unknown quantization mode 'int9'. Did you mean 'int8'\?") as info:
        edge.convert(digits_model, "int9")
    assert "Available: float32, dynamic, float16, int8, int16x8." in str(info.value)


def test_representative_data_of_the_wrong_shape(digits_model: Any) -> None:
    with pytest.raises(ValueError, match=r"must have shape \(n, 8, 8, 1\).*Received: shape=\(10, 7, 7, 1\)"):
        edge.convert(digits_model, "int8", np.zeros((10, 7, 7, 1), np.float32))


def test_int8_needs_representative_data(digits_model: Any) -> None:
    with pytest.raises(ValueError, match=r"quantization='int8' needs representative_data.*Received: "
                                         r"representative_data=None"):
        edge.convert(digits_model, "int8")


def test_non_finite_or_empty_representative_data(digits_model: Any) -> None:
    with pytest.raises(ValueError, match="finite"):
        edge.convert(digits_model, "int8", np.full((4, 8, 8, 1), np.nan, np.float32))
    with pytest.raises(ValueError, match="Received: 0 samples"):
        edge.convert(digits_model, "int8", np.zeros((0, 8, 8, 1), np.float32))


def test_unknown_model_name_suggests() -> None:
    with pytest.raises(ValueError, match=r"^No file 'ds_cn', and no zoo model of that name\. Did you mean 'ds_cnn'\? "
                                         r"Available: digits_cnn, "):
        edge.convert("ds_cn", "float32")


def test_missing_saved_model_path() -> None:
    with pytest.raises(FileNotFoundError, match=r"^No file 'nowhere/model.keras', and no zoo model of that name\. "
                                                r"Available: digits_cnn, "):
        edge.convert("nowhere/model.keras", "float32")


def test_empty_corrupt_and_truncated_flatbuffers(int8_artifact: Any, tmp_path: Path) -> None:
    with pytest.raises(edge.InvalidModelError, match=r"empty \(0 bytes\)"):
        edge.TFLiteArtifact(b"")
    with pytest.raises(edge.InvalidModelError, match=r"file identifier at bytes 4..8 is b'o wo', expected b'TFL3'"):
        edge.TFLiteArtifact(b"hello world 1234")
    with pytest.raises(edge.InvalidModelError, match=rf"corrupt or truncated \({len(int8_artifact.data) // 2} bytes\)"):
        edge.TFLiteArtifact(int8_artifact.data[: len(int8_artifact.data) // 2])
    empty = tmp_path / "empty.tflite"
    empty.write_bytes(b"")
    with pytest.raises(edge.InvalidModelError, match="empty"):
        edge.TFLiteArtifact.from_file(empty)
    with pytest.raises(FileNotFoundError, match="No file at .* expected a .tflite file"):
        edge.TFLiteArtifact.from_file(tmp_path / "missing.tflite")
    with pytest.raises(TypeError, match="must be bytes. Received: str"):
        edge.TFLiteArtifact("not bytes")  # type: ignore[arg-type]


def test_save_writes_exact_bytes_and_leaves_no_temporary(int8_artifact: Any, tmp_path: Path) -> None:
    path = int8_artifact.save(tmp_path / "sub" / "m.tflite")
    assert path.read_bytes() == int8_artifact.data
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["m.tflite"]


def test_modes_are_a_str_enum_and_a_registry() -> None:
    assert [m.value for m in edge.Quantization] == edge.QUANTIZATIONS.names()
    assert edge.Quantization("int8") == "int8"
    assert edge.QUANTIZATIONS.canonical("full-int8") == "int8"
    assert [n for n in edge.QUANTIZATIONS.names() if edge.QUANTIZATIONS.get(n).micro_compatible] == [
        "float32", "int8", "int16x8"]


@pytest.mark.slow
def test_importing_the_edge_package_does_not_import_tensorflow() -> None:
    import subprocess
    import sys

    code = ("import sys, tensorfleet.edge, tensorfleet.cli.edge; "
            "print(sorted(m for m in ('tensorflow', 'tflite_runtime', 'ai_edge_litert', "
            "'tensorflow_model_optimization') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_a_keras3_model_converts_in_its_own_keras(keras3_model: Any) -> None:
    from tensorfleet.compat.keras import Keras, keras_of

    rows = np.random.default_rng(0).uniform(-1, 1, size=(16, 4)).astype(np.float32)
    artifact = edge.convert(keras3_model, "int8", rows, progress=False)
    assert artifact.ops == ("FULLY_CONNECTED",)
    assert [(t.dtype, t.shape) for t in artifact.inputs + artifact.outputs] == [("int8", (1, 4)), ("int8", (1, 2))]
    assert keras_of(artifact.source_model) is Keras.KERAS3


def test_a_keras3_file_is_loaded_by_keras3_and_converts(keras3_model: Any, tmp_path: Path) -> None:
    from tensorfleet.compat.keras import Keras, keras_of

    saved = tmp_path / "k3.keras"
    keras3_model.save(saved)
    loaded = edge.load_keras_model(saved)
    assert keras_of(loaded) is Keras.KERAS3
    np.testing.assert_array_equal(loaded.get_weights()[0], keras3_model.get_weights()[0])
    rows = np.random.default_rng(1).uniform(-1, 1, size=(16, 4)).astype(np.float32)
    assert edge.convert(str(saved), "int8", rows, progress=False).ops == ("FULLY_CONNECTED",)


def _dense_weight_scales(artifact: Any) -> list[int]:
    graph = artifact.graph
    return [len(graph.tensors[op.inputs[1]].scales) for op in graph.operators if op.op == "FULLY_CONNECTED"]


@pytest.mark.slow
def test_dense_weights_are_quantized_per_tensor_unless_per_channel_is_asked(
        digits_model: Any, int8_artifact: Any, digits: Any) -> None:
    import tensorflow as tf

    from tensorfleet.compat.litert import dense_per_channel_supported

    assert _dense_weight_scales(int8_artifact) == [1, 1]  # as TF 2.14's converter made them, on both tracks
    with pytest.raises(ValueError, match=r"per_channel_dense applies to the full-integer modes \(int8, int16x8\)\. "
                                         r"Received: per_channel_dense=True with quantization='float32'"):
        edge.convert(digits_model, "float32", per_channel_dense=True)
    if not dense_per_channel_supported(tf.lite.TFLiteConverter.from_keras_model(digits_model)):  # TF 2.14
        with pytest.raises(ValueError, match=r"quantizes dense weights per tensor only\. "
                                             r"Received: per_channel_dense=True"):
            edge.convert(digits_model, "int8", digits.x_train, per_channel_dense=True, progress=False)
        return
    per_channel = edge.convert(digits_model, "int8", digits.x_train, num_calibration_samples=50,
                               per_channel_dense=True, progress=False)
    assert _dense_weight_scales(per_channel) == [int(digits_model.layers[-1].kernel.shape[0]), 10]
    # TFLM keeps a multiplier and a shift (int32 each) per output channel in the arena
    assert edge.find_arena_size(per_channel, progress=False) > edge.find_arena_size(int8_artifact, progress=False)


def test_dynamic_that_quantizes_no_weight_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # TensorFlow's converter quantizes only weights of 1,024 elements or more: a 40x25 kernel (1,000) stays
    # float32, a 41x25 one (1,025) becomes int8. The first file is a float32 model under the name 'dynamic'.
    import warnings

    from tensorfleet.cli.main import main
    from tensorfleet.compat.keras import keras2

    keras = keras2()
    small, large = (keras.Sequential([keras.Input((n,)), keras.layers.Dense(25)]) for n in (40, 41))
    with pytest.warns(edge.EdgeWarning) as said:
        artifact = edge.convert(small, "dynamic", progress=False)
    assert str(said[0].message) == (
        "quantization='dynamic' left every weight in float32: TensorFlow's converter quantizes only weight tensors "
        "of 1,024 elements or more, and this model has none. The file is a float32 model; 'int8' quantizes every "
        "weight.")
    assert infer_quantization(artifact.graph) == "float32"
    with warnings.catch_warnings():
        warnings.simplefilter("error", edge.EdgeWarning)
        assert infer_quantization(edge.convert(large, "dynamic", progress=False).graph) == "dynamic"
    small.save(tmp_path / "small.keras")
    assert main(["edge", "convert", str(tmp_path / "small.keras"), "-q", "dynamic", "-o", str(tmp_path / "s.tflite")]) \
        == 0
    assert capsys.readouterr().err == f"warning: {said[0].message}\n"
