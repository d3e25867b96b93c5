"""Reference TinyML models after the MLPerf Tiny benchmark, with offline synthetic data.

The four architectures follow the MLPerf Tiny v1.0 reference training code
(github.com/mlcommons/tiny, ``benchmark/training``; Banbury et al., "MLPerf Tiny Benchmark",
NeurIPS Datasets and Benchmarks 2021):

* ``ds_cnn``: keyword spotting, 49x10x1 MFCC input, 64 filters, four depthwise-separable
  blocks, 12 classes (Zhang et al., "Hello Edge", 2017).
* ``resnet8``: image classification, CIFAR-10 shaped 32x32x3 input, three residual stacks.
* ``anomaly_autoencoder``: anomaly detection, fully-connected autoencoder on 640 inputs
  (five frames of 128 log-mel bins, after the DCASE 2020 task 2 baseline).
* ``mobilenet_v1_025``: visual wake words, MobileNetV1 with width 0.25 on 96x96x3.

No machine this package is tested on reaches a dataset hub, so each model has a small
generated dataset with the right shapes and a learnable signal (:func:`synthetic`). The real
datasets load from their usual on-disk layouts, nothing is downloaded:
:func:`load_speech_commands` (MFCC features as MLPerf Tiny computes them), :func:`load_cifar10` (the binary
version; nothing is unpickled), :func:`load_toyadmos` (DCASE 2020 task 2 log-mel frames) and :func:`load_vww`.

Example:
    >>> import tensorfleet as tfl
    >>> model = tfl.models.build("ds_cnn")
    >>> model.input_shape, model.output_shape
    ((None, 49, 10, 1), (None, 12))
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tensorfleet.models.zoo import MODELS, resolve_keras, seeded_glorot
from tensorfleet.validation import positive_int, renamed

__all__ = [
    "ds_cnn",
    "resnet8",
    "anomaly_autoencoder",
    "mobilenet_v1_025",
    "TinyData",
    "synthetic",
    "REFERENCE",
    "KWS_WORDS",
    "mfcc_features",
    "load_speech_commands",
    "load_cifar10",
    "CIFAR10_RECORD_BYTES",
    "log_mel_frames",
    "load_toyadmos",
    "load_vww",
]


class Reference(NamedTuple):
    """Published facts about an MLPerf Tiny reference int8 model."""

    input_shape: tuple[int, ...]
    arena_bytes: int
    published_tflite_bytes: int | None
    task: str


# TFLM arenas measured for the published int8 files (MLPerf Tiny v1.0 reference submission).
REFERENCE: dict[str, Reference] = {
    "ds_cnn": Reference((49, 10, 1), 24_300, 53_936, "classification"),
    "resnet8": Reference((32, 32, 3), 56_000, None, "classification"),
    "anomaly_autoencoder": Reference((640,), 4_000, None, "reconstruction"),
    "mobilenet_v1_025": Reference((96, 96, 3), 103_700, None, "classification"),
}


def _init(K: Any, seed: int | None, k: int, *, relu: bool = False, depthwise: bool = False) -> Any:
    s = None if seed is None else seed + k
    # He init before ReLU keeps activations at scale through deep stacks; with Glorot an
    # untrained 27-layer MobileNet's logits shrink to ~1e-13, so small that TFLM's int8 softmax
    # aborts. Keras counts a depthwise kernel's fan-in as 9 * channels (not 9), so it gets an
    # explicit He standard deviation.
    if depthwise:
        return K.initializers.RandomNormal(stddev=float(np.sqrt(2.0 / 9.0)), seed=s)
    return K.initializers.HeNormal(seed=s) if relu else seeded_glorot(seed, k, K)


def ds_cnn(*, num_classes: int = 12, filters: int = 64, input_shape: tuple[int, int, int] = (49, 10, 1),
           seed: int | None = 0, keras: str | None = None) -> Any:
    """Depthwise-separable CNN for keyword spotting (MLPerf Tiny KWS reference), softmax out."""
    positive_int("num_classes", num_classes)
    positive_int("filters", filters)
    K = resolve_keras(keras)
    layers = K.layers
    reg = K.regularizers.l2(1e-4)
    inputs = K.Input(shape=input_shape, name="mfcc")
    x = layers.Conv2D(filters, (10, 4), strides=(2, 2), padding="same", kernel_regularizer=reg,
                      kernel_initializer=_init(K, seed, 0))(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    x = layers.Dropout(0.2)(x)
    for block in range(4):
        x = layers.DepthwiseConv2D((3, 3), padding="same", depthwise_regularizer=reg,
                                   depthwise_initializer=_init(K, seed, 10 + 2 * block))(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.Conv2D(filters, (1, 1), padding="same", kernel_regularizer=reg,
                          kernel_initializer=_init(K, seed, 11 + 2 * block))(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
    x = layers.Dropout(0.4)(x)
    x = layers.AveragePooling2D(pool_size=(input_shape[0] // 2, input_shape[1] // 2))(x)
    x = layers.Flatten()(x)
    outputs = layers.Dense(num_classes, activation="softmax", kernel_initializer=_init(K, seed, 30))(x)
    return K.Model(inputs, outputs, name="ds_cnn")


def resnet8(*, num_classes: int = 10, input_shape: tuple[int, int, int] = (32, 32, 3),
            seed: int | None = 0, keras: str | None = None) -> Any:
    """ResNet-8 for CIFAR-10 shaped images (MLPerf Tiny image classification reference)."""
    positive_int("num_classes", num_classes)
    K = resolve_keras(keras)
    layers = K.layers
    reg = K.regularizers.l2(1e-4)
    counter = iter(range(100))

    def conv(filters: int, kernel: int, strides: int = 1) -> Any:
        return layers.Conv2D(filters, kernel, strides=strides, padding="same", kernel_regularizer=reg,
                             kernel_initializer=_init(K, seed, next(counter)))

    inputs = K.Input(shape=input_shape, name="image")
    x = conv(16, 3)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    for filters, strides in ((16, 1), (32, 2), (64, 2)):
        y = conv(filters, 3, strides)(x)
        y = layers.BatchNormalization()(y)
        y = layers.Activation("relu")(y)
        y = conv(filters, 3)(y)
        y = layers.BatchNormalization()(y)
        shortcut = x if strides == 1 else conv(filters, 1, strides)(x)
        x = layers.Add()([shortcut, y])
        x = layers.Activation("relu")(x)
    x = layers.AveragePooling2D(pool_size=x.shape[1])(x)
    x = layers.Flatten()(x)
    outputs = layers.Dense(num_classes, activation="softmax", kernel_initializer=_init(K, seed, 99))(x)
    return K.Model(inputs, outputs, name="resnet8")


def anomaly_autoencoder(*, input_dim: int = 640, hidden: int = 128, bottleneck: int = 8,
                        seed: int | None = 0, keras: str | None = None) -> Any:
    """Fully-connected autoencoder for anomaly detection (MLPerf Tiny AD reference)."""
    positive_int("input_dim", input_dim)
    positive_int("hidden", hidden)
    positive_int("bottleneck", bottleneck)
    K = resolve_keras(keras)
    layers = K.layers
    inputs = K.Input(shape=(input_dim,), name="frames")
    x = inputs
    widths = [hidden] * 4 + [bottleneck] + [hidden] * 4
    for k, width in enumerate(widths):
        x = layers.Dense(width, kernel_initializer=_init(K, seed, k))(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
    outputs = layers.Dense(input_dim, kernel_initializer=_init(K, seed, 50), name="reconstruction")(x)
    return K.Model(inputs, outputs, name="anomaly_autoencoder")


def mobilenet_v1_025(*, num_classes: int = 2, input_shape: tuple[int, int, int] = (96, 96, 3),
                     seed: int | None = 0, keras: str | None = None) -> Any:
    """MobileNetV1 with width multiplier 0.25 for visual wake words (MLPerf Tiny VWW reference)."""
    positive_int("num_classes", num_classes)
    K = resolve_keras(keras)
    layers = K.layers
    counter = iter(range(100))

    def bn_relu(x: Any) -> Any:
        return layers.Activation("relu")(layers.BatchNormalization()(x))

    inputs = K.Input(shape=input_shape, name="image")
    x = bn_relu(layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False,
                              kernel_initializer=_init(K, seed, next(counter), relu=True))(inputs))
    plan = [(16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (128, 2)] + [(128, 1)] * 5 + [(256, 2), (256, 1)]
    for filters, strides in plan:
        x = bn_relu(layers.DepthwiseConv2D(3, strides=strides, padding="same", use_bias=False,
                                           depthwise_initializer=_init(K, seed, next(counter), depthwise=True))(x))
        x = bn_relu(layers.Conv2D(filters, 1, padding="same", use_bias=False,
                                  kernel_initializer=_init(K, seed, next(counter), relu=True))(x))
    x = layers.AveragePooling2D(pool_size=x.shape[1:3])(x)
    x = layers.Flatten()(x)
    outputs = layers.Dense(num_classes, activation="softmax", kernel_initializer=_init(K, seed, 99))(x)
    return K.Model(inputs, outputs, name="mobilenet_v1_025")


class TinyData(NamedTuple):
    """A generated dataset: inputs, labels (class ids, or None for reconstruction tasks)."""

    x: np.ndarray
    y: np.ndarray | None


def synthetic(name: str, *, n: int = 64, seed: int = 0, num_classes: int | None = None) -> TinyData:
    """A small generated dataset shaped for the TinyML model ``name``, with a learnable signal.

    Keyword spotting inputs are class-specific temporal modulations of the MFCC frames; image
    inputs are noise plus a class-specific template, in [0, 1]; the autoencoder's are low-rank
    "normal machine" frames in [0, 1]. Every class is learnable.

    Example:
        >>> data = synthetic("ds_cnn", n=8)
        >>> data.x.shape, data.y.shape
        ((8, 49, 10, 1), (8,))
    """
    positive_int("n", n)
    canonical = MODELS.canonical(name)
    if canonical not in REFERENCE:
        raise ValueError(f"synthetic() has data for {sorted(REFERENCE)}. Received: name={name!r}")
    ref = REFERENCE[canonical]
    rng = np.random.default_rng(seed)
    shape = ref.input_shape
    if ref.task == "reconstruction":
        basis = np.random.default_rng(1234).uniform(0.0, 1.0, size=(4, int(np.prod(shape))))
        weights = rng.dirichlet(np.ones(4), size=n)
        x = weights @ basis + rng.normal(0.0, 0.02, size=(n, basis.shape[1]))
        return TinyData(np.clip(x, 0.0, 1.0).astype(np.float32).reshape((n, *shape)), None)
    classes = num_classes or {"ds_cnn": 12, "resnet8": 10, "mobilenet_v1_025": 2}[canonical]
    y = rng.integers(0, classes, size=n).astype(np.int32)
    if canonical == "ds_cnn":
        # Keyword-like: each class is a temporal modulation rate (2..7 cycles per second of
        # frames) times a smooth or alternating cepstral profile, at a random phase; a
        # translation-invariant network (DS-CNN ends in global pooling) can learn it.
        frames, coeffs = shape[0], shape[1]
        t = np.arange(frames)[None, :, None]
        rate = 2.0 + (y % 6)[:, None, None]
        phase = rng.uniform(0.0, 2.0 * np.pi, size=(n, 1, 1))
        profile = np.where((y // 6 % 2)[:, None, None] == 1, (-1.0) ** np.arange(coeffs)[None, None, :], 1.0)
        x = np.sin(2.0 * np.pi * rate * t / frames + phase) * profile
        x = (x + 0.5 * rng.normal(0.0, 1.0, size=x.shape))[..., None]
        return TinyData(x.astype(np.float32), y)
    patterns = np.random.default_rng(4321).normal(0.0, 1.0, size=(classes, *shape))
    x = 0.5 * rng.normal(0.0, 1.0, size=(n, *shape)) + patterns[y]
    x = np.clip(0.5 + 0.15 * x, 0.0, 1.0)  # images: pixels in [0, 1]
    return TinyData(x.astype(np.float32), y)


# ---- loaders of the real datasets (files on disk; nothing is downloaded) ---------------------------------------

KWS_WORDS = ("down", "go", "left", "no", "off", "on", "right", "stop", "up", "yes")


def _check_dir(directory: str | os.PathLike[str], what: str) -> Path:
    path = Path(directory)
    if not path.is_dir():
        raise FileNotFoundError(f"No {what} directory at {str(path)!r}.")
    return path


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    """16-bit PCM mono (or the first channel) as float32 in [-1, 1], and its sample rate."""
    import wave

    with wave.open(str(path), "rb") as handle:
        if handle.getsampwidth() != 2:
            raise ValueError(f"Only 16-bit PCM WAV files are supported. Received: {str(path)!r} with "
                             f"{8 * handle.getsampwidth()}-bit samples")
        rate, channels = handle.getframerate(), handle.getnchannels()
        data = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")
    return (data.reshape(-1, channels)[:, 0].astype(np.float32) / 32768.0), rate


def mfcc_features(audio: np.ndarray, *, sample_rate: int = 16_000) -> np.ndarray:
    """MLPerf Tiny KWS features: 1 s padded/cut, 30 ms windows every 20 ms, 40 mel bins
    (20-4000 Hz), log, the first 10 MFCCs -> ``(49, 10, 1)`` float32."""
    import tensorflow as tf

    if sample_rate != 16_000:
        raise ValueError(f"Speech Commands audio must be 16 kHz. Received: sample_rate={sample_rate}")
    audio = np.asarray(audio, np.float32)[:16_000]
    audio = np.pad(audio, (0, 16_000 - len(audio)))
    stft = tf.signal.stft(audio, frame_length=480, frame_step=320, fft_length=512)
    spectrum = tf.abs(stft)
    mel = tf.signal.linear_to_mel_weight_matrix(40, spectrum.shape[-1], 16_000, 20.0, 4_000.0)
    log_mel = tf.math.log(tf.tensordot(spectrum, mel, 1) + 1e-6)
    mfcc = tf.signal.mfccs_from_log_mel_spectrograms(log_mel)[..., :10]
    return mfcc.numpy()[..., None].astype(np.float32)


@renamed(directory="data_dir")
def load_speech_commands(data_dir: str | os.PathLike[str], *, words: tuple[str, ...] = KWS_WORDS,
                         max_per_class: int | None = None) -> dict[str, TinyData]:
    """Google Speech Commands v2 as MLPerf Tiny uses it: ten keywords, ``_silence_``, ``_unknown_``.

    Expects the extracted archive: ``<data_dir>/<word>/<file>.wav`` (16 kHz mono),
    ``validation_list.txt`` and ``testing_list.txt`` (missing lists put everything in train).
    ``_background_noise_`` clips are cut into 1 s silence samples. Labels: ``words`` in order,
    then silence (len(words)) and unknown (len(words) + 1).

    Returns:
        ``{"train": ..., "validation": ..., "test": ...}`` of MFCC ``(n, 49, 10, 1)`` inputs.
    """
    root = _check_dir(data_dir, "Speech Commands")
    lists = {}
    for split, filename in (("validation", "validation_list.txt"), ("test", "testing_list.txt")):
        listing = root / filename
        lists[split] = set(listing.read_text().split()) if listing.is_file() else set()
    silence, unknown = len(words), len(words) + 1
    buckets: dict[str, tuple[list[np.ndarray], list[int]]] = {s: ([], []) for s in ("train", "validation", "test")}
    counts: dict[int, int] = {}
    for word_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for wav in sorted(word_dir.glob("*.wav")):
            audio, rate = _read_wav(wav)
            if word_dir.name == "_background_noise_":
                for start in range(0, len(audio) - rate + 1, rate):
                    buckets["train"][0].append(mfcc_features(audio[start:start + rate], sample_rate=rate))
                    buckets["train"][1].append(silence)
                continue
            label = words.index(word_dir.name) if word_dir.name in words else unknown
            if max_per_class is not None and counts.get(label, 0) >= max_per_class:
                continue
            counts[label] = counts.get(label, 0) + 1
            relative = f"{word_dir.name}/{wav.name}"
            split = ("validation" if relative in lists["validation"] else "test" if relative in lists["test"]
                     else "train")
            buckets[split][0].append(mfcc_features(audio, sample_rate=rate))
            buckets[split][1].append(label)
    if not any(buckets[s][0] for s in buckets):
        raise ValueError(f"No .wav files under {str(root)!r}; expected <word>/<file>.wav folders.")
    return {split: TinyData(np.stack(x) if x else np.zeros((0, 49, 10, 1), np.float32), np.asarray(y, np.int32))
            for split, (x, y) in buckets.items()}


CIFAR10_RECORD_BYTES = 1 + 32 * 32 * 3


def _read_cifar10_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One ``cifar-10-batches-bin`` file: records of 1 label byte and 3,072 pixel bytes (1,024
    red, then green, then blue, row by row) -> NHWC uint8 images and int32 labels."""
    raw = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    if raw.size == 0 or raw.size % CIFAR10_RECORD_BYTES:
        raise ValueError(f"{str(path)!r} is not a CIFAR-10 binary batch: its {raw.size} bytes are not a whole "
                         f"number of {CIFAR10_RECORD_BYTES}-byte records (1 label byte + 3,072 pixel bytes).")
    records = raw.reshape(-1, CIFAR10_RECORD_BYTES)
    labels = records[:, 0].astype(np.int32)
    if labels.max() > 9:
        raise ValueError(f"{str(path)!r} is not a CIFAR-10 binary batch: label {int(labels.max())} is not in 0..9.")
    return records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


@renamed(directory="data_dir")
def load_cifar10(data_dir: str | os.PathLike[str]) -> dict[str, TinyData]:
    """CIFAR-10, binary version (the extracted ``cifar-10-batches-bin`` folder: ``data_batch_1.bin``
    .. ``data_batch_5.bin`` and ``test_batch.bin``), as float32 NHWC in [0, 1].

    The binary files are plain bytes, read with numpy; the python version's pickles are not
    read, because unpickling a file can run arbitrary code.
    """
    root = _check_dir(data_dir, "CIFAR-10")
    out = {}
    for split, pattern in (("train", "data_batch_*.bin"), ("test", "test_batch.bin")):
        files = sorted(root.glob(pattern))
        if not files:
            hint = ("; this folder holds the python version's pickles, which tensorfleet does not read: use the "
                    "binary version (cifar-10-binary.tar.gz)") if any(root.glob("data_batch_[0-9]")) else ""
            raise FileNotFoundError(f"No CIFAR-10 {pattern!r} file in {str(root)!r} (expected the extracted "
                                    f"cifar-10-batches-bin folder){hint}.")
        images, labels = zip(*(_read_cifar10_batch(file) for file in files))
        out[split] = TinyData(np.concatenate(images).astype(np.float32) / 255.0, np.concatenate(labels))
    return out


def log_mel_frames(audio: np.ndarray, *, sample_rate: int = 16_000, n_mels: int = 128, frames: int = 5,
                   n_fft: int = 1024, hop: int = 512) -> np.ndarray:
    """DCASE 2020 task 2 baseline features: log-mel (128 bins) of ``frames`` consecutive frames,
    concatenated -> ``(n, 640)`` float32."""
    import tensorflow as tf

    stft = tf.signal.stft(np.asarray(audio, np.float32), frame_length=n_fft, frame_step=hop, fft_length=n_fft)
    power = tf.abs(stft) ** 2
    mel = tf.signal.linear_to_mel_weight_matrix(n_mels, power.shape[-1], sample_rate, 0.0, sample_rate / 2.0)
    log_mel = (10.0 * np.log10(tf.tensordot(power, mel, 1).numpy() + np.finfo(np.float32).eps)).astype(np.float32)
    count = log_mel.shape[0] - frames + 1
    if count < 1:
        raise ValueError(f"The clip is too short for {frames} frames of {n_fft} samples every {hop}. "
                         f"Received: {len(audio)} samples")
    return np.concatenate([log_mel[k:k + count] for k in range(frames)], axis=1)


@renamed(directory="data_dir")
def load_toyadmos(data_dir: str | os.PathLike[str], *, machine: str = "ToyCar") -> dict[str, TinyData]:
    """ToyADMOS as packaged for DCASE 2020 task 2: ``<data_dir>/<machine>/{train,test}/*.wav``.

    Train clips are normal; test clip names start with ``normal_`` or ``anomaly_``. Each clip
    becomes its 640-wide log-mel frame vectors; ``y`` is 0 (normal) or 1 (anomaly) per vector.
    """
    root = _check_dir(Path(data_dir) / machine, f"ToyADMOS {machine}")
    out = {}
    for split in ("train", "test"):
        xs, ys = [], []
        for wav in sorted((root / split).glob("*.wav")):
            audio, rate = _read_wav(wav)
            vectors = log_mel_frames(audio, sample_rate=rate)
            xs.append(vectors)
            ys.append(np.full(len(vectors), 1 if wav.name.startswith("anomaly") else 0, np.int32))
        if not xs:
            raise FileNotFoundError(f"No .wav files in {str(root / split)!r}.")
        out[split] = TinyData(np.concatenate(xs), np.concatenate(ys))
    return out


@renamed(directory="data_dir")
def load_vww(data_dir: str | os.PathLike[str], *, size: int = 96) -> TinyData:
    """Visual Wake Words as MLPerf Tiny trains it: ``<data_dir>/person/*`` and ``<data_dir>/non_person/*``
    images (JPEG/PNG), resized to ``size`` x ``size`` RGB in [0, 1]; label 1 = person."""
    import tensorflow as tf

    root = _check_dir(data_dir, "Visual Wake Words")
    xs, ys = [], []
    for label, sub in ((0, "non_person"), (1, "person")):
        for image in sorted(p for p in (root / sub).glob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png")):
            decoded = tf.io.decode_image(image.read_bytes(), channels=3, expand_animations=False)
            xs.append(tf.image.resize(tf.cast(decoded, tf.float32) / 255.0, (size, size)).numpy())
            ys.append(label)
    if not xs:
        raise FileNotFoundError(f"No images in {str(root)!r}/person or /non_person.")
    return TinyData(np.stack(xs).astype(np.float32), np.asarray(ys, np.int32))


MODELS.register("ds_cnn", ds_cnn, aliases=("kws", "keyword_spotting"),
                description="MLPerf Tiny keyword spotting DS-CNN: 49x10x1 MFCC, 64 filters, 12 classes, softmax.")
MODELS.register("resnet8", resnet8, aliases=("resnet_8", "image_classification"),
                description="MLPerf Tiny image classification ResNet-8: 32x32x3 (CIFAR-10), 10 classes, softmax.")
MODELS.register("anomaly_autoencoder", anomaly_autoencoder, aliases=("autoencoder", "anomaly_detection"),
                description="MLPerf Tiny anomaly detection FC autoencoder: 640 inputs, 8-unit bottleneck.")
MODELS.register("mobilenet_v1_025", mobilenet_v1_025, aliases=("vww", "visual_wake_words"),
                description="MLPerf Tiny visual wake words MobileNetV1 0.25: 96x96x3, 2 classes, softmax.")
