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
generated dataset with the right shapes and a learnable signal (:func:`synthetic`).

Example:
    >>> import tensorfleet as tfl
    >>> model = tfl.models.build("ds_cnn")
    >>> model.input_shape, model.output_shape
    ((None, 49, 10, 1), (None, 12))
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tensorfleet.models.zoo import MODELS

__all__ = [
    "ds_cnn",
    "resnet8",
    "anomaly_autoencoder",
    "mobilenet_v1_025",
    "TinyData",
    "synthetic",
    "REFERENCE",
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


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{key} must be a positive integer. Received: {key}={value!r}")


def _init(seed: int | None, k: int, *, relu: bool = False, depthwise: bool = False) -> Any:
    import tensorflow as tf

    s = None if seed is None else seed + k
    # He init before ReLU keeps activations at scale through deep stacks; with Glorot an
    # untrained 27-layer MobileNet's logits shrink to ~1e-13, so small that TFLM's int8 softmax
    # aborts. Keras counts a depthwise kernel's fan-in as 9 * channels (not 9), so it gets an
    # explicit He standard deviation.
    if depthwise:
        return tf.keras.initializers.RandomNormal(stddev=float(np.sqrt(2.0 / 9.0)), seed=s)
    return tf.keras.initializers.HeNormal(seed=s) if relu else tf.keras.initializers.GlorotUniform(seed=s)


def ds_cnn(*, num_classes: int = 12, filters: int = 64, input_shape: tuple[int, int, int] = (49, 10, 1),
           seed: int | None = 0) -> Any:
    """Depthwise-separable CNN for keyword spotting (MLPerf Tiny KWS reference), softmax out."""
    _check_positive(num_classes=num_classes, filters=filters)
    import tensorflow as tf

    layers = tf.keras.layers
    reg = tf.keras.regularizers.l2(1e-4)
    inputs = tf.keras.Input(shape=input_shape, name="mfcc")
    x = layers.Conv2D(filters, (10, 4), strides=(2, 2), padding="same", kernel_regularizer=reg,
                      kernel_initializer=_init(seed, 0))(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    x = layers.Dropout(0.2)(x)
    for block in range(4):
        x = layers.DepthwiseConv2D((3, 3), padding="same", depthwise_regularizer=reg,
                                   depthwise_initializer=_init(seed, 10 + 2 * block))(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.Conv2D(filters, (1, 1), padding="same", kernel_regularizer=reg,
                          kernel_initializer=_init(seed, 11 + 2 * block))(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
    x = layers.Dropout(0.4)(x)
    x = layers.AveragePooling2D(pool_size=(input_shape[0] // 2, input_shape[1] // 2))(x)
    x = layers.Flatten()(x)
    outputs = layers.Dense(num_classes, activation="softmax", kernel_initializer=_init(seed, 30))(x)
    return tf.keras.Model(inputs, outputs, name="ds_cnn")


def resnet8(*, num_classes: int = 10, input_shape: tuple[int, int, int] = (32, 32, 3),
            seed: int | None = 0) -> Any:
    """ResNet-8 for CIFAR-10 shaped images (MLPerf Tiny image classification reference)."""
    _check_positive(num_classes=num_classes)
    import tensorflow as tf

    layers = tf.keras.layers
    reg = tf.keras.regularizers.l2(1e-4)
    counter = iter(range(100))

    def conv(filters: int, kernel: int, strides: int = 1) -> Any:
        return layers.Conv2D(filters, kernel, strides=strides, padding="same", kernel_regularizer=reg,
                             kernel_initializer=_init(seed, next(counter)))

    inputs = tf.keras.Input(shape=input_shape, name="image")
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
    outputs = layers.Dense(num_classes, activation="softmax", kernel_initializer=_init(seed, 99))(x)
    return tf.keras.Model(inputs, outputs, name="resnet8")


def anomaly_autoencoder(*, input_dim: int = 640, hidden: int = 128, bottleneck: int = 8,
                        seed: int | None = 0) -> Any:
    """Fully-connected autoencoder for anomaly detection (MLPerf Tiny AD reference)."""
    _check_positive(input_dim=input_dim, hidden=hidden, bottleneck=bottleneck)
    import tensorflow as tf

    layers = tf.keras.layers
    inputs = tf.keras.Input(shape=(input_dim,), name="frames")
    x = inputs
    widths = [hidden] * 4 + [bottleneck] + [hidden] * 4
    for k, width in enumerate(widths):
        x = layers.Dense(width, kernel_initializer=_init(seed, k))(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
    outputs = layers.Dense(input_dim, kernel_initializer=_init(seed, 50), name="reconstruction")(x)
    return tf.keras.Model(inputs, outputs, name="anomaly_autoencoder")


def mobilenet_v1_025(*, num_classes: int = 2, input_shape: tuple[int, int, int] = (96, 96, 3),
                     seed: int | None = 0) -> Any:
    """MobileNetV1 with width multiplier 0.25 for visual wake words (MLPerf Tiny VWW reference)."""
    _check_positive(num_classes=num_classes)
    import tensorflow as tf

    layers = tf.keras.layers
    counter = iter(range(100))

    def bn_relu(x: Any) -> Any:
        return layers.Activation("relu")(layers.BatchNormalization()(x))

    inputs = tf.keras.Input(shape=input_shape, name="image")
    x = bn_relu(layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False,
                              kernel_initializer=_init(seed, next(counter), relu=True))(inputs))
    plan = [(16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (128, 2)] + [(128, 1)] * 5 + [(256, 2), (256, 1)]
    for filters, strides in plan:
        x = bn_relu(layers.DepthwiseConv2D(3, strides=strides, padding="same", use_bias=False,
                                           depthwise_initializer=_init(seed, next(counter), depthwise=True))(x))
        x = bn_relu(layers.Conv2D(filters, 1, padding="same", use_bias=False,
                                  kernel_initializer=_init(seed, next(counter), relu=True))(x))
    x = layers.AveragePooling2D(pool_size=x.shape[1:3])(x)
    x = layers.Flatten()(x)
    outputs = layers.Dense(num_classes, activation="softmax", kernel_initializer=_init(seed, 99))(x)
    return tf.keras.Model(inputs, outputs, name="mobilenet_v1_025")


class TinyData(NamedTuple):
    """A generated dataset: inputs, labels (class ids, or None for reconstruction tasks)."""

    x: np.ndarray
    y: np.ndarray | None


def synthetic(name: str, *, n: int = 64, seed: int = 0, num_classes: int | None = None) -> TinyData:
    """A small generated dataset shaped for the TinyML model ``name``, with a learnable signal.

    Classification inputs are noise plus a class-specific pattern, so a model can learn them;
    the autoencoder's are low-rank "normal machine" frames in [0, 1].

    Example:
        >>> data = synthetic("ds_cnn", n=8)
        >>> data.x.shape, data.y.shape
        ((8, 49, 10, 1), (8,))
    """
    _check_positive(n=n)
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
    patterns = np.random.default_rng(4321).normal(0.0, 1.0, size=(classes, *shape))
    y = rng.integers(0, classes, size=n).astype(np.int32)
    x = 0.5 * rng.normal(0.0, 1.0, size=(n, *shape)) + patterns[y]
    if canonical != "ds_cnn":  # images: pixels in [0, 1]
        x = np.clip(0.5 + 0.15 * x, 0.0, 1.0)
    return TinyData(x.astype(np.float32), y)


MODELS.register("ds_cnn", ds_cnn, aliases=("kws", "keyword_spotting"),
                description="MLPerf Tiny keyword spotting DS-CNN: 49x10x1 MFCC, 64 filters, 12 classes, softmax.")
MODELS.register("resnet8", resnet8, aliases=("resnet_8", "image_classification"),
                description="MLPerf Tiny image classification ResNet-8: 32x32x3 (CIFAR-10), 10 classes, softmax.")
MODELS.register("anomaly_autoencoder", anomaly_autoencoder, aliases=("autoencoder", "anomaly_detection"),
                description="MLPerf Tiny anomaly detection FC autoencoder: 640 inputs, 8-unit bottleneck.")
MODELS.register("mobilenet_v1_025", mobilenet_v1_025, aliases=("vww", "visual_wake_words"),
                description="MLPerf Tiny visual wake words MobileNetV1 0.25: 96x96x3, 2 classes, softmax.")
