"""A small transformer-block classifier for model-parallel examples and tests.

An 8x8 digit is read as a sequence of 8 rows of 8 pixels: a dense embedding, one transformer
block (self-attention and an MLP, each with a residual connection, after Vaswani et al.,
"Attention Is All You Need", 2017), mean pooling over the sequence and a dense classifier
that outputs logits. The block has no normalisation layer, so the same function written in
Mesh-TensorFlow or split with Megatron-style tensor parallelism matches it exactly.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from tensorfleet.models.zoo import MODELS, resolve_keras, seeded_glorot
from tensorfleet.validation import positive_int

__all__ = ["TransformerBlock", "block_class", "transformer_block"]


def _block_class(K: Any) -> Any:
    class TransformerBlock(K.layers.Layer):
        """``h = x + MHA(x, x)``; ``out = h + Dense(d_model)(Dense(hidden, relu)(h))``."""

        def __init__(self, *, num_heads: int, key_dim: int, hidden: int, seed: int | None = 0,
                     **kwargs: Any) -> None:
            super().__init__(**kwargs)
            init = partial(seeded_glorot, seed, keras=K)
            self.num_heads, self.key_dim, self.hidden, self.seed = num_heads, key_dim, hidden, seed
            self.attention = K.layers.MultiHeadAttention(
                num_heads, key_dim, kernel_initializer=init(10), name="attention")
            self.dense1 = K.layers.Dense(hidden, activation="relu", kernel_initializer=init(11), name="mlp_in")
            self._init_out = init(12)
            self.dense2: Any = None

        def build(self, input_shape: Any) -> None:
            d_model = int(input_shape[-1])
            self.dense2 = K.layers.Dense(d_model, kernel_initializer=self._init_out, name="mlp_out")
            super().build(input_shape)

        def call(self, inputs: Any) -> Any:
            h = inputs + self.attention(inputs, inputs)
            return h + self.dense2(self.dense1(h))

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "num_heads": self.num_heads, "key_dim": self.key_dim,
                    "hidden": self.hidden, "seed": self.seed}

    return TransformerBlock


_CLASSES: dict[str, Any] = {}


def block_class(keras: Any = None) -> Any:
    """The ``TransformerBlock`` layer class of ``keras`` (a Keras module or name; None: the caller's Keras)."""
    K = resolve_keras(keras)
    if K.__name__ not in _CLASSES:
        _CLASSES[K.__name__] = _block_class(K)
    return _CLASSES[K.__name__]


def __getattr__(name: str) -> Any:
    # The Keras layer class is made on first use so that importing this module needs no TensorFlow.
    if name == "TransformerBlock":
        return block_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def transformer_block(*, num_classes: int = 10, seq_len: int = 8, features: int = 8, d_model: int = 16,
                      num_heads: int = 4, key_dim: int = 4, hidden: int = 32, seed: int | None = 0,
                      keras: str | None = None) -> Any:
    """Embedding, one transformer block, mean pooling, logits; input ``(seq_len, features)``.

    Digits from ``load_digits()`` fit as ``x[..., 0]`` (8 rows of 8 pixels).

    Example:
        >>> model = transformer_block()
        >>> model.output_shape
        (None, 10)
    """
    positive_int("num_classes", num_classes)
    positive_int("seq_len", seq_len)
    positive_int("features", features)
    positive_int("d_model", d_model)
    positive_int("num_heads", num_heads)
    positive_int("key_dim", key_dim)
    positive_int("hidden", hidden)
    K = resolve_keras(keras)
    init = partial(seeded_glorot, seed, keras=K)
    block_cls = block_class(K)
    inputs = K.Input(shape=(seq_len, features), name="rows")
    x = K.layers.Dense(d_model, kernel_initializer=init(0), name="embed")(inputs)
    x = block_cls(num_heads=num_heads, key_dim=key_dim, hidden=hidden, seed=seed, name="block")(x)
    x = K.layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = K.layers.Dense(num_classes, kernel_initializer=init(1), name="logits")(x)
    return K.Model(inputs, outputs, name="transformer_block")


MODELS.register("transformer_block", transformer_block, aliases=("transformer",),
                description="Embedding, one transformer block (attention + MLP), mean pooling, logits; "
                            "8x8 digits as 8 rows.")
