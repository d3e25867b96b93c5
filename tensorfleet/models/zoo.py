"""Model factories. Each returns an uncompiled ``tf.keras.Model``; ``seed`` fixes the
initial weights so that runs under different strategies start from the same point."""

from __future__ import annotations

from typing import Any

from tensorfleet.registry import Registry
from tensorfleet.validation import positive_int

__all__ = ["MODELS", "digits_cnn", "digits_mlp"]

MODELS: Registry[Any] = Registry("model")


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        positive_int(key, value)


def digits_cnn(*, num_classes: int = 10, filters: int = 16, seed: int | None = 0,
               input_shape: tuple[int, int, int] = (8, 8, 1)) -> Any:
    """A small CNN for 8x8 digits (MNIST-style): conv-conv-pool-dense. 96%+ in a few epochs."""
    _check_positive(num_classes=num_classes, filters=filters)
    import tensorflow as tf

    init = lambda k: tf.keras.initializers.GlorotUniform(seed=None if seed is None else seed + k)  # noqa: E731
    inputs = tf.keras.Input(shape=input_shape, name="image")
    x = tf.keras.layers.Conv2D(filters, 3, padding="same", activation="relu", kernel_initializer=init(0))(inputs)
    x = tf.keras.layers.Conv2D(2 * filters, 3, padding="same", activation="relu", kernel_initializer=init(1))(x)
    x = tf.keras.layers.MaxPooling2D(2)(x)
    x = tf.keras.layers.Flatten()(x)
    x = tf.keras.layers.Dense(64, activation="relu", kernel_initializer=init(2))(x)
    outputs = tf.keras.layers.Dense(num_classes, kernel_initializer=init(3), name="logits")(x)
    return tf.keras.Model(inputs, outputs, name="digits_cnn")


def digits_mlp(*, num_classes: int = 10, hidden: int = 64, seed: int | None = 0, input_dim: int = 64) -> Any:
    """A two-layer MLP on flattened 8x8 digits."""
    _check_positive(num_classes=num_classes, hidden=hidden, input_dim=input_dim)
    import tensorflow as tf

    init = lambda k: tf.keras.initializers.GlorotUniform(seed=None if seed is None else seed + k)  # noqa: E731
    inputs = tf.keras.Input(shape=(input_dim,), name="pixels")
    x = tf.keras.layers.Dense(hidden, activation="relu", kernel_initializer=init(0))(inputs)
    outputs = tf.keras.layers.Dense(num_classes, kernel_initializer=init(1), name="logits")(x)
    return tf.keras.Model(inputs, outputs, name="digits_mlp")


MODELS.register("digits_cnn", digits_cnn, aliases=("mnist_cnn",),
                description="Small MNIST-style CNN for 8x8 digits (conv-conv-pool-dense), logits out.")
MODELS.register("digits_mlp", digits_mlp, aliases=("mlp",),
                description="Two-layer MLP on flattened 8x8 digits, logits out.")
