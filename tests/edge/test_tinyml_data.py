"""Loaders of the real TinyML datasets, on small files the tests write in their formats."""

from __future__ import annotations

import pickle
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


def test_cifar10_python_batches(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name, n in (("data_batch_1", 3), ("data_batch_2", 2), ("test_batch", 4)):
        images = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        with open(tmp_path / name, "wb") as handle:
            pickle.dump({b"data": images, b"labels": list(range(n))}, handle)
    data = tinyml.load_cifar10(tmp_path)
    assert data["train"].x.shape == (5, 32, 32, 3) and data["test"].x.shape == (4, 32, 32, 3)
    assert data["train"].y.tolist() == [0, 1, 2, 0, 1]
    with open(tmp_path / "test_batch", "rb") as handle:
        first = pickle.load(handle)[b"data"][0]
    # channel-first rows of 1024 become NHWC: red plane first
    assert data["test"].x[0, 0, 0, 0] == pytest.approx(first[0] / 255.0)
    assert data["test"].x[0, 0, 0, 1] == pytest.approx(first[1024] / 255.0)
    with pytest.raises(FileNotFoundError, match="No CIFAR-10 directory"):
        tinyml.load_cifar10(tmp_path / "missing")


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
