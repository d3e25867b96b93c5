"""Memory savers: wrappers that make training under any strategy hold less memory per device.

* :func:`accumulate_gradients`: k micro-batches per batch, one update (activations of one
  micro-batch at a time);
* :func:`mixed_precision`: a Keras mixed-precision policy plus loss scaling (16-bit activations
  and gradients);
* :func:`recompute`: ``tf.recompute_grad`` around a block of layers (Chen et al., "Training Deep
  Nets with Sublinear Memory Cost", 2016): its activations are rebuilt in the backward pass.

They wrap a plain Keras model or layer, so ``compile`` and ``fit`` stay as they are, under any
``tf.distribute`` strategy. :mod:`tensorfleet.planner.memory` estimates what each one saves.

Example:
    >>> import tensorflow as tf
    >>> import tensorfleet as tfl
    >>> from tensorfleet.strategies import memory_savers
    >>> with memory_savers.mixed_precision("mixed_bfloat16"):
    ...     model = tfl.models.build("digits_mlp")
    >>> model.layers[1].compute_dtype
    'bfloat16'
"""

from __future__ import annotations

import contextlib
from enum import Enum
from typing import Any, Iterator, Sequence

from tensorfleet.compat.keras import is_keras3_model, keras2, require_keras2
from tensorfleet.validation import choice, positive_int

__all__ = ["Precision", "accumulate_gradients", "mixed_precision", "recompute"]


class Precision(str, Enum):
    """``float32`` everywhere, or mixed (16-bit compute, 32-bit master weights and states)."""

    FLOAT32 = "float32"
    MIXED_FLOAT16 = "mixed_float16"
    MIXED_BFLOAT16 = "mixed_bfloat16"


def accumulate_gradients(model: Any, steps: int) -> Any:
    """A model that trains like ``model`` but splits every batch into ``steps`` micro-batches.

    Gradients of the micro-batches are averaged (weighted by their sizes) and applied once,
    so activations are held for one micro-batch at a time. Keras 2 (tf_keras) has no such option.
    The returned model shares ``model``'s layers and weights; compile and fit it as usual.

    Args:
        model: a functional or sequential Keras model.
        steps: micro-batches per batch; each batch's size must be divisible by it.

    Returns:
        A ``tf.keras.Model`` whose ``train_step`` accumulates.

    Raises:
        tensorfleet.compat.keras.Keras3ModelError: ``model`` is a Keras 3 model.

    Example:
        >>> import tensorflow as tf
        >>> import tensorfleet as tfl
        >>> data = tfl.models.datasets.load_digits(flat=True)
        >>> acc = accumulate_gradients(tfl.models.build("digits_mlp"), steps=4)
        >>> acc.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> history = acc.fit(data.x_train[:512], data.y_train[:512], batch_size=256, verbose=0)
        >>> int(acc.optimizer.iterations)  # one update per batch of 256 (four micro-batches of 64)
        2
    """
    import tensorflow as tf

    steps = positive_int("steps", steps)
    require_keras2(model, "accumulate_gradients")
    if not getattr(model, "inputs", None):
        raise TypeError(
            "accumulate_gradients needs a built functional or sequential tf.keras.Model. "
            f"Received: {type(model).__name__}"
        )

    class GradientAccumulationModel(keras2().Model):
        def train_step(self, data: Any) -> dict[str, Any]:
            x, y, sample_weight = keras2().utils.unpack_x_y_sample_weight(data)
            if sample_weight is not None:
                raise ValueError("accumulate_gradients does not support sample weights.")
            size = tf.shape(tf.nest.flatten(x)[0])[0]
            tf.debugging.assert_equal(size % steps, 0, message=f"batch size must be divisible by steps={steps}")
            micro = size // steps
            variables = self.trainable_variables

            def body(i: Any, *total: Any) -> tuple[Any, ...]:
                xs = tf.nest.map_structure(lambda t: t[i * micro:(i + 1) * micro], x)
                ys = tf.nest.map_structure(lambda t: t[i * micro:(i + 1) * micro], y)
                with tf.GradientTape() as tape:
                    pred = self(xs, training=True)
                    loss = self.compute_loss(xs, ys, pred, None)
                grads = tape.gradient(loss, variables)
                self.compiled_metrics.update_state(ys, pred)
                return (i + 1, *[t if g is None else t + g / steps for t, g in zip(total, grads)])

            # One micro-batch at a time (parallel_iterations=1): otherwise the runtime may run
            # several at once and hold all their activations, which is what this is meant to avoid.
            _, *total = tf.while_loop(lambda i, *_: i < steps, body,
                                      (tf.constant(0), *[tf.zeros_like(v) for v in variables]),
                                      parallel_iterations=1)
            self.optimizer.apply_gradients(zip(total, variables))
            return self.get_metrics_result()

    return GradientAccumulationModel(inputs=model.inputs, outputs=model.outputs,
                                     name=f"{model.name}_accumulate{steps}")


@contextlib.contextmanager
def mixed_precision(policy: str | Precision = "mixed_float16") -> Iterator[Any]:
    """Builds models inside under a Keras mixed-precision policy; restores the old one after.

    Yields a function that wraps an optimizer for loss scaling (needed with float16):
    ``LossScaleOptimizer`` with dynamic scaling.

    Example:
        >>> import tensorflow as tf
        >>> import tensorfleet as tfl
        >>> with mixed_precision("mixed_float16") as wrap:
        ...     model = tfl.models.build("digits_cnn")
        ...     model.compile(optimizer=wrap(tf.keras.optimizers.Adam()),
        ...                   loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> model.layers[1].compute_dtype, model.layers[1].variable_dtype
        ('float16', 'float32')
        >>> isinstance(model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
        True
        >>> tf.keras.mixed_precision.global_policy().name  # restored on leaving the block
        'float32'
    """

    prec = choice(Precision, "policy", policy)
    old = keras2().mixed_precision.global_policy()
    keras2().mixed_precision.set_global_policy(prec.value)

    def wrap(optimizer: Any) -> Any:
        if prec is Precision.MIXED_FLOAT16:
            return keras2().mixed_precision.LossScaleOptimizer(optimizer)
        return optimizer  # bfloat16 has float32's range: no loss scaling

    try:
        yield wrap
    finally:
        keras2().mixed_precision.set_global_policy(old)


_RECOMPUTE_CLASS: list[type] = []


def _recompute_class() -> type:
    """The Keras layer class, created on first use so that importing this module stays TF-free."""
    if _RECOMPUTE_CLASS:
        return _RECOMPUTE_CLASS[0]
    import tensorflow as tf

    class RecomputeBlock(keras2().layers.Layer):
        """Applies ``layers`` in order; under training, through ``tf.recompute_grad``."""

        def __init__(self, layers: Sequence[Any], **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.block = list(layers)

        def build(self, input_shape: Any) -> None:
            shape = input_shape
            for layer in self.block:
                if not layer.built:
                    layer.build(shape)
                shape = layer.compute_output_shape(shape)
            super().build(input_shape)

        def _forward(self, x: Any) -> Any:
            for layer in self.block:
                x = layer(x)
            return x

        def call(self, inputs: Any, training: Any = None) -> Any:
            if not training:
                return self._forward(inputs)
            return tf.recompute_grad(self._forward)(inputs)

        def compute_output_shape(self, input_shape: Any) -> Any:
            for layer in self.block:
                input_shape = layer.compute_output_shape(input_shape)
            return input_shape

    _RECOMPUTE_CLASS.append(RecomputeBlock)
    return RecomputeBlock


def recompute(layers: Sequence[Any], *, name: str | None = None) -> Any:
    """A block of layers whose activations are recomputed in the backward pass.

    Inside, ``tf.recompute_grad`` keeps only the block's input during the forward pass and
    runs the block again when gradients are needed: memory for compute, with the same
    gradients. Outside training (``training`` false) the block runs plainly.

    Args:
        layers: the layers of the block (not shared elsewhere), applied in order.
        name: the block's layer name.

    Returns:
        A Keras layer.

    Raises:
        tensorfleet.compat.keras.Keras3ModelError: a layer is a Keras 3 layer.

    Example:
        >>> import tensorflow as tf
        >>> inputs = tf.keras.Input((8, 8, 1))
        >>> x = tf.keras.layers.Flatten()(inputs)
        >>> x = recompute([tf.keras.layers.Dense(256, "relu"), tf.keras.layers.Dense(256, "relu")])(x)
        >>> model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))
        >>> model.output_shape, model.count_params()
        ((None, 10), 85002)
    """
    if not isinstance(layers, (list, tuple)) or not layers:
        raise ValueError(f"recompute needs a non-empty list of Keras layers. Received: layers={layers!r}")
    for layer in layers:
        if is_keras3_model(layer):  # a Keras 3 layer inside a tf_keras layer fails deep in Keras otherwise
            require_keras2(layer, "recompute")
    return _recompute_class()(layers, name=name)
