"""Loaders of the real TinyML datasets, on small files the tests write in their formats."""

from __future__ import annotations

import re
import wave
from pathlib import Path

import numpy as np
import pytest

from tensorfleet.models import tinyml


def _write_wav(path: Path, audio: np.ndarray, rate: int = 16_000) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def _tone(freq: float, seconds: float = 1.0, rate: int = 16_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return 0.5 * np.sin(2 * np.pi * freq * t)


def test_speech_commands_layout_splits_and_labels(tmp_path: Path) -> None:
    _write_wav(tmp_path / "yes" / "a_nohash_0.wav", _tone(440))
    _write_wav(tmp_path / "yes" / "b_nohash_0.wav", _tone(450, 0.5))  # shorter than 1 s: padded
    _write_wav(tmp_path / "no" / "c_nohash_0.wav", _tone(880))
    _write_wav(tmp_path / "cat" / "d_nohash_0.wav", _tone(300))  # not a keyword: unknown
    _write_wav(tmp_path / "_background_noise_" / "noise.wav", 0.1 * np.random.default_rng(0).normal(size=40_000))
    (tmp_path / "validation_list.txt").write_text("no/c_nohash_0.wav\n")
    (tmp_path / "testing_list.txt").write_text("cat/d_nohash_0.wav\n")
    data = tinyml.load_speech_commands(tmp_path)
    yes, no, silence, unknown = tinyml.KWS_WORDS.index("yes"), tinyml.KWS_WORDS.index("no"), 10, 11
    assert data["train"].x.shape == (4, 49, 10, 1)  # two "yes" and two 1 s cuts of the noise
    assert sorted(data["train"].y.tolist()) == sorted([yes, yes, silence, silence])
    assert data["validation"].y.tolist() == [no] and data["test"].y.tolist() == [unknown]
    assert np.all(np.isfinite(data["train"].x))
    # different tones give different features
    assert not np.allclose(data["validation"].x[0], data["test"].x[0])


def test_mfcc_features_shape_and_rate_check() -> None:
    assert tinyml.mfcc_features(_tone(1000)).shape == (49, 10, 1)
    with pytest.raises(ValueError, match="must be 16 kHz. Received: sample_rate=8000"):
        tinyml.mfcc_features(_tone(1000), sample_rate=8000)


def _write_cifar10_bin(path: Path, labels: list[int], images: np.ndarray) -> None:
    """The cifar-10-batches-bin layout: per record 1 label byte, then 1,024 red, green, blue bytes."""
    records = np.concatenate([np.asarray(labels, np.uint8)[:, None], images.reshape(len(labels), 3072)], axis=1)
    path.write_bytes(records.astype(np.uint8).tobytes())


def test_cifar10_binary_batches(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    first_test = None
    for name, labels in (("data_batch_1.bin", [3, 1, 4]), ("data_batch_2.bin", [1, 5]),
                         ("test_batch.bin", [9, 2, 6, 5])):
        images = rng.integers(0, 256, size=(len(labels), 3, 32, 32), dtype=np.uint8)
        _write_cifar10_bin(tmp_path / name, labels, images)
        first_test = images[0] if name == "test_batch.bin" else first_test
    (tmp_path / "batches.meta.txt").write_text("airplane\nautomobile\n")  # shipped beside them; ignored
    data = tinyml.load_cifar10(tmp_path)
    assert data["train"].x.shape == (5, 32, 32, 3) and data["test"].x.shape == (4, 32, 32, 3)
    assert data["train"].y.tolist() == [3, 1, 4, 1, 5] and data["test"].y.tolist() == [9, 2, 6, 5]
    assert data["train"].x.dtype == np.float32 and data["train"].y.dtype == np.int32
    # channel-first planes of 1,024 bytes become NHWC: pixel (row 1, column 2) of each plane
    assert data["test"].x[0, 1, 2].tolist() == pytest.approx((first_test[:, 1, 2] / 255.0).tolist())


def test_cifar10_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="No CIFAR-10 directory"):
        tinyml.load_cifar10(tmp_path / "missing")
    with pytest.warns(DeprecationWarning, match="load_cifar10: 'directory' is now 'data_dir'"), \
            pytest.raises(FileNotFoundError, match="No CIFAR-10 directory"):
        tinyml.load_cifar10(directory=tmp_path / "missing")  # the older keyword, for one release
    (tmp_path / "data_batch_1").write_bytes(b"\x80\x04")  # the python version's pickles
    with pytest.raises(FileNotFoundError, match=r"No CIFAR-10 'data_batch_\*\.bin' file .*; this folder holds "
                                                r"the python version's pickles, which tensorfleet does not read"):
        tinyml.load_cifar10(tmp_path)
    (tmp_path / "data_batch_1.bin").write_bytes(bytes(3073 + 10))
    (tmp_path / "test_batch.bin").write_bytes(bytes(3073))
    with pytest.raises(ValueError, match=r"its 3083 bytes are not a whole number of 3073-byte records"):
        tinyml.load_cifar10(tmp_path)
    _write_cifar10_bin(tmp_path / "data_batch_1.bin", [10], np.zeros((1, 3072), np.uint8))
    with pytest.raises(ValueError, match=r"label 10 is not in 0\.\.9"):
        tinyml.load_cifar10(tmp_path)


def test_no_module_of_the_package_unpickles() -> None:
    import tensorfleet

    root = Path(tensorfleet.__file__).parent
    users = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if re.search(r"\bimport pickle\b|\bpickle\.loads?\(|allow_pickle=True", p.read_text())]
    assert users == []


def test_toyadmos_normal_and_anomaly_vectors(tmp_path: Path) -> None:
    root = tmp_path / "ToyCar"
    _write_wav(root / "train" / "normal_id_01_00000000.wav", _tone(500, 0.5))
    _write_wav(root / "test" / "normal_id_01_00000000.wav", _tone(500, 0.5))
    _write_wav(root / "test" / "anomaly_id_01_00000000.wav", _tone(2000, 0.5))
    data = tinyml.load_toyadmos(tmp_path)
    frames = (8000 - 1024) // 512 + 1  # 14 STFT frames in 0.5 s, 10 windows of 5
    assert data["train"].x.shape == (frames - 4, 640)
    assert data["test"].y.tolist() == [1] * (frames - 4) + [0] * (frames - 4)  # sorted: anomaly_ first
    with pytest.raises(ValueError, match="too short"):
        tinyml.log_mel_frames(np.zeros(1500, np.float32))


def test_vww_person_and_non_person_folders(tmp_path: Path) -> None:
    import tensorflow as tf

    for sub, value in (("person", 200), ("non_person", 20)):
        (tmp_path / sub).mkdir()
        image = tf.fill((40, 60, 3), tf.constant(value, tf.uint8))
        (tmp_path / sub / "img.png").write_bytes(tf.io.encode_png(image).numpy())
    data = tinyml.load_vww(tmp_path)
    assert data.x.shape == (2, 96, 96, 3) and data.y.tolist() == [0, 1]
    assert data.x[1].mean() == pytest.approx(200 / 255, abs=1e-5)
    with pytest.raises(FileNotFoundError, match="No Visual Wake Words directory"):
        tinyml.load_vww(tmp_path / "none")
