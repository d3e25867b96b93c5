"""Model factories. Each returns an uncompiled Keras model; ``seed`` fixes the initial weights so that
runs under different strategies start from the same point, and ``keras`` says which Keras builds it:
``"keras3"``, ``"keras2"`` (tf_keras), or None for the Keras ``tf.keras`` is in the caller's process."""

from __future__ import annotations

from functools import partial
from typing import Any

from tensorfleet.registry import Registry
from tensorfleet.validation import positive_int

__all__ = ["MODELS", "digits_cnn", "digits_mlp", "resolve_keras", "seeded_glorot"]

MODELS: Registry[Any] = Registry("model")


def seeded_glorot(seed: int | None, k: int, keras: Any = None) -> Any:
    """A GlorotUniform initializer for the ``k``-th layer of a model: seeded with ``seed + k``, or
    unseeded when ``seed`` is None; from ``keras`` (a Keras module or name, None for the caller's)."""
    return resolve_keras(keras).initializers.GlorotUniform(seed=None if seed is None else seed + k)


def resolve_keras(keras: Any) -> Any:
    """``keras`` as a Keras module: a module as it is; a name (``"keras3"``, ``"keras2"``/``"tf_keras"``), a Keras
    object (a model: its own Keras) or None (the Keras ``tf.keras`` is in the caller's process) through
    :func:`tensorfleet.compat.keras.keras_module`."""
    import types

    from tensorfleet.compat.keras import keras_module

    return keras if isinstance(keras, types.ModuleType) else keras_module(keras)


def digits_cnn(*, num_classes: int = 10, filters: int = 16, seed: int | None = 0,
               input_shape: tuple[int, int, int] = (8, 8, 1), keras: str | None = None) -> Any:
    """A small CNN for 8x8 digits (scikit-learn's ``load_digits``): conv-conv-pool-dense. 96%+ in a few
    epochs. For other images (28x28 MNIST), pass their ``input_shape``."""
    positive_int("num_classes", num_classes)
    positive_int("filters", filters)
    K = resolve_keras(keras)
    init = partial(seeded_glorot, seed, keras=K)
    inputs = K.Input(shape=input_shape, name="image")
    x = K.layers.Conv2D(filters, 3, padding="same", activation="relu", kernel_initializer=init(0))(inputs)
    x = K.layers.Conv2D(2 * filters, 3, padding="same", activation="relu", kernel_initializer=init(1))(x)
    x = K.layers.MaxPooling2D(2)(x)
    x = K.layers.Flatten()(x)
    x = K.layers.Dense(64, activation="relu", kernel_initializer=init(2))(x)
    outputs = K.layers.Dense(num_classes, kernel_initializer=init(3), name="logits")(x)
    return K.Model(inputs, outputs, name="digits_cnn")


def digits_mlp(*, num_classes: int = 10, hidden: int = 64, seed: int | None = 0, input_dim: int = 64,
               keras: str | None = None) -> Any:
    """A two-layer MLP on flattened 8x8 digits."""
    positive_int("num_classes", num_classes)
    positive_int("hidden", hidden)
    positive_int("input_dim", input_dim)
    K = resolve_keras(keras)
    init = partial(seeded_glorot, seed, keras=K)
    inputs = K.Input(shape=(input_dim,), name="pixels")
    x = K.layers.Dense(hidden, activation="relu", kernel_initializer=init(0))(inputs)
    outputs = K.layers.Dense(num_classes, kernel_initializer=init(1), name="logits")(x)
    return K.Model(inputs, outputs, name="digits_mlp")


MODELS.register("digits_cnn", digits_cnn,
                description="Small CNN for 8x8 digits (scikit-learn's load_digits; conv-conv-pool-dense), logits out.")
MODELS.register("digits_mlp", digits_mlp, aliases=("mlp",),
                description="Two-layer MLP on flattened 8x8 digits, logits out.")
