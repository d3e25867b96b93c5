"""``tensorfleet edge ...`` through the CLI entry point."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tensorfleet.cli.main import main


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "digits.tflite"
    assert main(["edge", "convert", "digits_cnn", "--quantization", "int8", "--out", str(out),
                 "--samples", "20"]) == 0
    return out


def test_convert_writes_an_int8_tflite(converted: Path) -> None:
    from tensorfleet import edge

    artifact = edge.TFLiteArtifact.from_file(converted)
    assert artifact.quantization == "int8"
    assert artifact.inputs[0].dtype == "int8"


def test_convert_errors_leave_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.tflite"
    assert main(["edge", "convert", "digits_cnn", "-q", "int9", "--out", str(out)]) == 2
    assert "error: Unknown quantization mode 'int9'. Did you mean 'int8'?" in capsys.readouterr().err
    data = tmp_path / "bad.npy"
    np.save(data, np.zeros((5, 7, 7, 1), np.float32))
    assert main(["edge", "convert", "digits_cnn", "-q", "int8", "--data", str(data), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: --data {str(data)!r} must hold samples shaped like the model's input, "
                                       "an array of shape (n, 8, 8, 1). Received: shape=(5, 7, 7, 1)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npy"]


@pytest.mark.slow
def test_report_with_target_json_and_plot(converted: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    j, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main(["edge", "report", str(converted), "--target", "bluepill", "--json", str(j), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "target stm32f103c8 (flash 65,536, RAM 20,480): fits" in out
    assert json.loads(j.read_text())["target"]["board"]["name"] == "stm32f103c8"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["edge", "report", str(converted), "--target", "flash=16K,ram=4K"]) == 1
    assert "does NOT fit" in capsys.readouterr().out


@pytest.mark.slow
def test_export_and_validate(converted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["edge", "export", str(converted), "--name", "digits_v1", "--out", str(tmp_path / "c")]) == 0
    names = sorted(p.name for p in (tmp_path / "c").iterdir())
    assert names == ["digits_v1_model_data.cc", "digits_v1_model_data.h", "digits_v1_op_resolver.h"]
    assert "kDigitsV1TensorArenaSize" in (tmp_path / "c" / "digits_v1_model_data.h").read_text()
    assert "arena search" not in capsys.readouterr().err  # stderr is no terminal here: no bar redrawn into a log
    assert main(["edge", "validate", str(converted)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "arena search" not in captured.err and "TFLM" not in captured.err, captured.err
    assert re.search(r"; smallest arena [\d,]+ bytes for the TFLM Python interpreter's RecordingMicroAllocator - a "
                     r"safe size for a firmware, whose plain MicroAllocator needs 240-424 bytes less\n$", out), out
    assert main(["edge", "validate", str(converted), "--arena-bytes", "100"]) == 2
    err = capsys.readouterr().err
    assert "error: The tensor arena is too small" in err and "Received: arena_bytes=100" in err
    assert main(["edge", "validate", str(converted), "--arena-size", "100"]) == 2  # the older flag, for one release
    err = capsys.readouterr().err
    assert err.startswith("warning: --arena-size is now --arena-bytes; the older flag will stop working in the next "
                          "release.\n") and "Received: arena_bytes=100" in err
    assert err.count("warning:") == 1, err  # said once, in the command line's words
    assert main(["edge", "validate", str(converted), "--progress"]) == 0  # asked for: drawn all the same
    assert "arena search" in capsys.readouterr().err


def test_corrupt_and_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 32)
    assert main(["edge", "report", str(bad)]) == 2
    assert f"error: {str(bad)!r}: Not a TFLite flatbuffer" in capsys.readouterr().err
    assert main(["edge", "export", str(tmp_path / "none.tflite"), "--name", "x", "--out", str(tmp_path)]) == 2
    assert "error: No file at" in capsys.readouterr().err


def test_listings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["edge", "modes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["float32", "dynamic", "float16", "int8", "int16x8"]
    assert main(["edge", "boards"]) == 0
    assert "nucleo_l4r5zi (l4r5zi): flash 2,097,152 B, RAM 655,360 B" in capsys.readouterr().out


def test_calibration_data_for_names() -> None:
    from tensorfleet.cli.edge import calibration_data

    assert calibration_data("kws", 3).shape == (3, 49, 10, 1)
    assert calibration_data("digits_mlp", 5).shape == (5, 64)
    with pytest.raises(ValueError, match="Unknown model"):
        calibration_data("nope", 3)


def test_convert_a_saved_keras_model(digits_model: object, digits: object, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "digits.keras"
    digits_model.save(saved)  # type: ignore[attr-defined]
    out = tmp_path / "saved.tflite"
    assert main(["edge", "convert", str(saved), "-q", "int8", "--out", str(out)]) == 2
    assert "needs --data FILE.npy" in capsys.readouterr().err and not out.exists()
    data = tmp_path / "cal.npy"
    np.save(data, digits.x_train[:20])  # type: ignore[attr-defined]
    assert main(["edge", "convert", str(saved), "-q", "int8", "--data", str(data), "--out", str(out),
                 "--metadata", str(tmp_path / "meta.json")]) == 0
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["quantization"] == "int8" and meta["bytes"] == out.stat().st_size
    assert meta["ops"] == ["CONV_2D", "CONV_2D", "MAX_POOL_2D", "RESHAPE", "FULLY_CONNECTED", "FULLY_CONNECTED"]


@pytest.mark.slow
def test_a_keras3_file_converts_in_a_users_process_then_reports_exports_and_compiles(
        keras3: object, digits_model: object, digits: object, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    from tensorfleet import models
    from tensorfleet.compat.keras import Keras, saved_keras
    from tests.conftest import user_env
    from tests.edge.test_export import GXX, HARNESS

    k3 = models.build("digits_cnn", keras=keras3)
    k3.set_weights(digits_model.get_weights())  # type: ignore[attr-defined]
    saved, rep, out = tmp_path / "k3.keras", tmp_path / "rep.npy", tmp_path / "m.tflite"
    k3.save(saved)
    assert saved_keras(saved) is Keras.KERAS3
    np.save(rep, digits.x_train[:50])  # type: ignore[attr-defined]
    child = subprocess.run([sys.executable, "-m", "tensorfleet.cli.main", "edge", "convert", str(saved),
                            "--quantization", "int8", "--data", str(rep), "--out", str(out)],
                           env=user_env(TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    assert re.search(r"^wrote .*m\.tflite \([\d,]+ bytes, int8\); input int8 \[1, 8, 8, 1\], output int8 \[1, 10\]; "
                     r"ops: CONV_2D, FULLY_CONNECTED, MAX_POOL_2D, RESHAPE$", child.stdout, re.M), child.stdout
    assert main(["edge", "report", str(out), "--target", "bluepill"]) == 0
    assert "target stm32f103c8 (flash 65,536, RAM 20,480): fits" in capsys.readouterr().out
    assert main(["edge", "export", str(out), "--name", "kws", "--out", str(tmp_path / "c")]) == 0
    header = (tmp_path / "c" / "kws_model_data.h").read_text()
    arena = int(re.search(r"kKwsTensorArenaSize = (\d+);", header).group(1))  # type: ignore[union-attr]
    if GXX is not None:  # the exported array compiles and holds the .tflite byte for byte
        (tmp_path / "c" / "harness.cc").write_text(HARNESS)
        exe = tmp_path / "harness"
        subprocess.run([GXX, "-std=c++17", "-Wall", "-Werror", f"-DARENA={arena}", "-I", str(tmp_path / "c"),
                        str(tmp_path / "c" / "harness.cc"), str(tmp_path / "c" / "kws_model_data.cc"), "-o", str(exe)],
                       check=True, capture_output=True, timeout=120)
        written = tmp_path / "roundtrip.tflite"
        assert subprocess.run([str(exe), str(written)], timeout=30).returncode == 0
        assert written.read_bytes() == out.read_bytes()
    small = tmp_path / "small.keras"
    assert main(["edge", "decompose", str(saved), "--method", "tucker2", "--energy", "0.9", "--out", str(small)]) == 0
    assert saved_keras(small) is Keras.KERAS3  # decomposed in the Keras that wrote the model


def test_a_missing_or_damaged_file_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.tflite"
    assert main(["edge", "convert", "nofile.keras", "--quantization", "int8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: No file 'nofile.keras', and no zoo model of that name. Available: digits_cnn, ")
    assert err.count("\n") == 1
    damaged = tmp_path / "damaged.keras"
    damaged.write_bytes(b"PK\x03\x04 not really a zip")
    assert main(["edge", "convert", str(damaged), "--quantization", "float32", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {damaged} starts as a zip archive but its end is missing or damaged"), err
    assert err.count("\n") == 1 and not out.exists()


def test_a_name_that_is_not_a_c_identifier_is_refused_with_a_suggestion(
        converted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["edge", "export", str(converted), "--name", "digits-v1", "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == (
        "error: name must be letters, digits and single underscores, starting with a letter (it becomes "
        "g_<name>_model_data and <Name>OpResolver); '-' is not allowed. Received: name='digits-v1'. "
        "Use e.g. name='digits_v1'.\n")
    assert not (tmp_path / "c").exists()


def test_unwritable_out_is_named_before_any_conversion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    wrong_shape = tmp_path / "bad.npy"
    np.save(wrong_shape, np.zeros((5, 7, 7, 1), np.float32))  # would fail the conversion, which must not start
    assert main(["edge", "convert", "digits_cnn", "-q", "int8", "--data", str(wrong_shape),
                 "--out", str(a_file / "kws.tflite")]) == 2
    assert capsys.readouterr().err == (f"error: Cannot write '{a_file}/kws.tflite': '{a_file}' is a file, not a "
                                       f"directory. Choose a path you can write to.\n")
    if Path("/sys").is_dir():  # a directory not even root may write to
        assert main(["edge", "convert", "digits_cnn", "-q", "int8", "--data", str(wrong_shape),
                     "--out", "/sys/kws.tflite"]) == 2
        err = capsys.readouterr().err
        assert (err.startswith("error: Cannot write '/sys/kws.tflite': permission denied in '/sys'.")
                and ".tmp" not in err)


def test_unwritable_report_and_export_destinations_fail_before_measuring(
        converted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["edge", "report", str(converted), "--json", str(a_file / "r.json")]) == 2
    assert f"error: Cannot write '{a_file}/r.json'" in capsys.readouterr().err
    assert main(["edge", "export", str(converted), "--name", "kws", "--out", str(a_file / "c")]) == 2
    assert f"error: Cannot write '{a_file}/c/kws_model_data.h': '{a_file}' is a file" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["99999999999999999999", "67108865"])
def test_huge_arena_size_is_refused_with_the_bound(converted: Path, size: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["edge", "validate", str(converted), "--arena-bytes", size]) == 2
    assert capsys.readouterr().err == (f"error: arena_bytes must be an integer from 1 to 67108864. "
                                       f"Received: arena_bytes={size}\n")


@pytest.mark.slow
def test_validate_with_data_states_the_agreement_with_desktop_tflite(
        converted: Path, digits: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "x.npy"
    np.save(data, digits.x_test[:30])  # type: ignore[attr-defined]
    assert main(["edge", "validate", str(converted), "--data", str(data)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"30 samples: TFLM vs (ai_edge_litert|tflite_runtime|tensorflow) \(reference kernels\): "
                        r"(bit-identical|within one quantization step, [\d,]+ of 300 outputs equal \(\d+\.\d%\))",
                        last), last


def test_per_channel_dense_is_refused_for_a_float_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "f.tflite"
    assert main(["edge", "convert", "digits_cnn", "-q", "float32", "--per-channel-dense", "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("error: --per-channel-dense applies to int8 and int16x8. "
                                       "Received: --quantization float32\n")
    assert not out.exists()
