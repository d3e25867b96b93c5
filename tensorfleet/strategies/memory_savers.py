"""Memory savers: wrappers that make training under any strategy hold less memory per device.

* :func:`accumulate_gradients`: k micro-batches per batch, one update (activations of one
  micro-batch at a time);
* :func:`mixed_precision`: a Keras mixed-precision policy plus loss scaling (16-bit activations
  and gradients);
* :func:`recompute`: ``tf.recompute_grad`` around a block of layers (Chen et al., "Training Deep
  Nets with Sublinear Memory Cost", 2016): its activations are rebuilt in the backward pass.

They wrap a plain Keras model or layer, so ``compile`` and ``fit`` stay as they are, under any
``tf.distribute`` strategy, in the Keras the model or layers are written in: Keras 3 (``import keras``) or
tf_keras (Keras 2); one block of layers from both Kerases is refused. :mod:`tensorfleet.planner.memory`
estimates what each one saves.

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
import sys
from enum import Enum
from types import ModuleType
from typing import Any, Iterator, Sequence

from tensorfleet.compat.keras import Keras, keras2, keras3, keras_module, keras_of, module_of, user_keras
from tensorfleet.validation import choice, positive_int

__all__ = ["Precision", "accumulate_gradients", "mixed_precision", "recompute"]


class Precision(str, Enum):
    """``float32`` everywhere, or mixed (16-bit compute, 32-bit master weights and states)."""

    FLOAT32 = "float32"
    MIXED_FLOAT16 = "mixed_float16"
    MIXED_BFLOAT16 = "mixed_bfloat16"


def accumulate_gradients(model: Any, steps: int) -> Any:
    """A model that trains like ``model`` but splits every batch into ``steps`` micro-batches.

    Gradients of the micro-batches are averaged (the micro-batches are equally large) and applied once,
    so activations are held for one micro-batch at a time; the optimizer counts one step per batch and
    the logged loss and metrics are the batch's. The returned model shares ``model``'s layers and
    weights and is of ``model``'s Keras (Keras 3 or tf_keras); compile and fit it as usual.

    Keras 2 (tf_keras) has no such option. Keras 3's optimizers take ``gradient_accumulation_steps=k``,
    which accumulates over k *batches* of ``fit`` instead: the same update when each batch is a
    micro-batch, but ``fit``'s batches, steps, callbacks and logs are then the micro-batches', and
    the option belongs to the optimizer rather than the model. This one keeps ``fit``'s batch as the
    unit in both Kerases.

    Args:
        model: a functional or sequential Keras model (Keras 3 or tf_keras).
        steps: micro-batches per batch; each batch's size must be divisible by it.

    Returns:
        A model of ``model``'s Keras whose ``train_step`` accumulates.

    Raises:
        TypeError: ``model`` is not a functional or sequential Keras model.
        ValueError: ``steps`` is not a positive integer; at run time, a batch not divisible by
            ``steps``, or sample weights.

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
    steps = positive_int("steps", steps)
    which = keras_of(model, "accumulate_gradients")
    keras = keras_module(which)
    if not isinstance(model, keras.Model) or not getattr(model, "inputs", None):
        raise TypeError("accumulate_gradients needs a built functional or sequential Keras model. "
                        f"Received: {type(model).__name__}")
    make = _keras3_accumulation if which is Keras.KERAS3 else _keras2_accumulation
    return make(keras, steps)(inputs=model.inputs, outputs=model.outputs, name=f"{model.name}_accumulate{steps}")


def _micro_batches(x: Any, y: Any, sample_weight: Any, steps: int) -> tuple[Any, Any]:
    """The size of one micro-batch of the batch ``x``, and a function ``i -> (x_i, y_i)``."""
    import tensorflow as tf

    if sample_weight is not None:
        raise ValueError("accumulate_gradients does not support sample weights. Received: sample_weight of "
                         f"shape {getattr(sample_weight, 'shape', None)}")
    size = tf.shape(tf.nest.flatten(x)[0])[0]
    tf.debugging.assert_equal(size % steps, 0, message=f"batch size must be divisible by steps={steps}")
    micro = size // steps

    def part(i: Any) -> tuple[Any, Any]:
        cut = lambda t: t[i * micro:(i + 1) * micro]  # noqa: E731
        return tf.nest.map_structure(cut, x), tf.nest.map_structure(cut, y)

    return micro, part


def _accumulate(steps: int, variables: Any, micro_step: Any) -> list[Any]:
    """The mean over ``steps`` micro-batches of ``micro_step(i)``'s gradients, one micro-batch at a time.

    The first micro-batch runs before the loop: a metric that builds its variables on its first update
    (Keras 3's compiled metrics, without a strategy) must not create them inside a ``tf.while_loop``.
    """
    import tensorflow as tf

    first = micro_step(tf.constant(0))
    total = [tf.zeros_like(v) if g is None else g / steps for v, g in zip(variables, first)]

    def body(i: Any, *total: Any) -> tuple[Any, ...]:
        grads = micro_step(i)
        return (i + 1, *[t if g is None else t + g / steps for t, g in zip(total, grads)])

    # One micro-batch at a time (parallel_iterations=1): otherwise the runtime may run several at once
    # and hold all their activations, which is what this is meant to avoid.
    _, *total = tf.while_loop(lambda i, *_: i < steps, body, (tf.constant(1), *total), parallel_iterations=1)
    return total


def _keras2_accumulation(keras: Any, steps: int) -> type:
    import tensorflow as tf

    class GradientAccumulationModel(keras.Model):
        def train_step(self, data: Any) -> dict[str, Any]:
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            _, part = _micro_batches(x, y, sample_weight, steps)
            variables = self.trainable_variables

            def micro_step(i: Any) -> list[Any]:
                xs, ys = part(i)
                with tf.GradientTape() as tape:
                    pred = self(xs, training=True)
                    loss = self.compute_loss(xs, ys, pred, None)
                self.compiled_metrics.update_state(ys, pred)
                return tape.gradient(loss, variables)

            self.optimizer.apply_gradients(zip(_accumulate(steps, variables, micro_step), variables))
            return self.get_metrics_result()

    return GradientAccumulationModel


def _keras3_accumulation(keras: Any, steps: int) -> type:
    import tensorflow as tf

    class GradientAccumulationModel(keras.Model):
        def train_step(self, data: Any) -> dict[str, Any]:
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            micro, part = _micro_batches(x, y, sample_weight, steps)
            variables = self.trainable_variables
            # Keras 3 divides a replica's loss by the replicas in sync (their gradients are summed); the
            # logged loss is the replica's own, as Keras' train_step logs it.
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
            tracker = next(m for m in self.metrics if m.name == "loss")

            def micro_step(i: Any) -> list[Any]:
                xs, ys = part(i)
                with tf.GradientTape() as tape:
                    pred = self(xs, training=True)
                    loss = self.compute_loss(x=xs, y=ys, y_pred=pred, training=True)
                    scaled = self.optimizer.scale_loss(loss)  # a LossScaleOptimizer's loss scaling
                tracker.update_state(loss * tf.cast(replicas, loss.dtype), sample_weight=micro)
                self.compute_metrics(xs, ys, pred)
                return tape.gradient(scaled, variables)

            self.optimizer.apply_gradients(zip(_accumulate(steps, variables, micro_step), variables))
            return self.get_metrics_result()

    return GradientAccumulationModel


def _kerases_in_use() -> list[ModuleType]:
    """The Kerases a model built now could be written in: tf_keras (when installed), and Keras 3 when this
    process has imported it or ``tf.keras`` is Keras 3 (never imported here otherwise)."""
    modules = []
    with contextlib.suppress(ImportError):
        modules.append(keras2())
    if "keras" in sys.modules or user_keras() is Keras.KERAS3:
        with contextlib.suppress(ImportError):  # the tff track's keras is Keras 2.14
            modules.append(keras3())
    return [m for i, m in enumerate(modules) if all(m is not other for other in modules[:i])]


@contextlib.contextmanager
def mixed_precision(policy: str | Precision = "mixed_float16") -> Iterator[Any]:
    """Builds models inside under a Keras mixed-precision policy; restores the old one after.

    The policy is set in each Keras a model can be built in here (tf_keras, and Keras 3 once imported or when
    ``tf.keras`` is Keras 3). Yields a function that wraps an optimizer for loss scaling (needed with float16):
    the ``LossScaleOptimizer`` of the optimizer's own Keras, with dynamic scaling.

    Raises:
        ValueError: ``policy`` is not one of :class:`Precision` (the message lists them).
        TypeError: (from the yielded function) what it wraps is not a Keras optimizer.

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
    kerases = _kerases_in_use()
    old = [keras.mixed_precision.global_policy() for keras in kerases]
    for keras in kerases:
        keras.mixed_precision.set_global_policy(prec.value)

    def wrap(optimizer: Any) -> Any:
        keras = module_of(optimizer, "mixed_precision's wrap", "optimizer")
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"mixed_precision's wrap takes a Keras optimizer. Received: optimizer of type "
                            f"{type(optimizer).__qualname__}")
        if prec is Precision.MIXED_FLOAT16:
            return keras.mixed_precision.LossScaleOptimizer(optimizer)
        return optimizer  # bfloat16 has float32's range: no loss scaling

    try:
        yield wrap
    finally:
        for keras, policy_before in zip(kerases, old):
            keras.mixed_precision.set_global_policy(policy_before)


_RECOMPUTE_CLASSES: dict[Keras, type] = {}


def _build_in_order(block: Sequence[Any], input_shape: Any) -> None:
    """Builds the layers of ``block`` not built yet, each on the output shape of the one before."""
    shape = input_shape
    for layer in block:
        if not layer.built:
            layer.build(shape)
        shape = layer.compute_output_shape(shape)


def _apply_in_order(block: Sequence[Any], x: Any) -> Any:
    for layer in block:
        x = layer(x)
    return x


def _output_shape(block: Sequence[Any], input_shape: Any) -> Any:
    for layer in block:
        input_shape = layer.compute_output_shape(input_shape)
    return input_shape


def _recompute_class(which: Keras) -> type:
    """The Keras layer class of ``which`` Keras, created on first use so that importing this module stays TF-free."""
    if which in _RECOMPUTE_CLASSES:
        return _RECOMPUTE_CLASSES[which]
    import tensorflow as tf

    base: Any = keras_module(which).layers.Layer  # a class of a module the type checker does not follow

    class RecomputeBlock(base):
        """Applies ``layers`` in order; under training, through ``tf.recompute_grad``."""

        def __init__(self, layers: Sequence[Any], **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.block = list(layers)

        def build(self, input_shape: Any) -> None:
            _build_in_order(self.block, input_shape)
            super().build(input_shape)

        def _forward(self, x: Any) -> Any:
            return _apply_in_order(self.block, x)

        def call(self, inputs: Any, training: Any = None) -> Any:
            if not training:
                return self._forward(inputs)
            return tf.recompute_grad(self._forward)(inputs)

        def compute_output_shape(self, input_shape: Any) -> Any:
            return _output_shape(self.block, input_shape)

    _RECOMPUTE_CLASSES[which] = RecomputeBlock
    return RecomputeBlock


def recompute(layers: Sequence[Any], *, name: str | None = None) -> Any:
    """A block of layers whose activations are recomputed in the backward pass.

    Inside, ``tf.recompute_grad`` keeps only the block's input during the forward pass and
    runs the block again when gradients are needed: memory for compute, with the same
    gradients. Outside training (``training`` false) the block runs plainly.

    Args:
        layers: the layers of the block (not shared elsewhere), applied in order, all of one Keras
            (Keras 3 or tf_keras).
        name: the block's layer name.

    Returns:
        A Keras layer of the layers' Keras.

    Raises:
        ValueError: ``layers`` is not a non-empty list.
        TypeError: an entry is not a Keras layer, or the layers mix Keras 3 and tf_keras.

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
    kerases = [keras_of(layer, "recompute", "layer") for layer in layers]
    for layer, which in zip(layers, kerases):
        if not isinstance(layer, keras_module(which).layers.Layer):
            raise TypeError(f"recompute takes Keras layers. Received: layer of type {type(layer).__qualname__}")
    if len(set(kerases)) > 1:  # a layer of one Keras inside a layer of the other fails deep in Keras otherwise
        named = ", ".join(f"{layer.name} ({which.value})" for layer, which in zip(layers, kerases))
        raise TypeError("recompute takes layers of one Keras: all Keras 3 (import keras) or all tf_keras "
                        f"(import tf_keras). Received: {named}")
    return _recompute_class(kerases[0])(layers, name=name)
