"""Quantization-aware training, magnitude pruning and weight clustering for Keras 3 models, without tfmot.

tensorflow-model-optimization (tfmot) wraps Keras 2 (tf_keras) models only; :mod:`tensorfleet.edge.optimize`
sends a Keras 3 model here. Each technique rebuilds the model's graph with one wrapper around each weighted layer
(``Conv1D``/``Conv2D``/``Conv3D``, ``DepthwiseConv2D``, ``Dense``) that runs the layer's own operation on a
transformed kernel:

- **QAT** (Jacob et al., "Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only
  Inference", CVPR 2018; BatchNorm folding as in Krishnamoorthi, "Quantizing deep convolutional networks for
  efficient inference", 2018, section 3.2): the kernel is fake-quantized to int8 (symmetric, narrow range; one
  scale per output channel for convolutions, one per tensor for ``Dense``, as tfmot and TFLite's converter do),
  with a ``BatchNormalization`` that follows it folded in *before* quantization, so that the weights trained
  are the int8 weights the converter writes:
  ``y = conv(x, Q(W * g / s)) * (s / s_B) + (b' - g * mu_B / s_B)`` in training (batch statistics, ``s`` from
  the moving variance) and ``y = conv(x, Q(W * g / s)) + (b' - g * mu / s)`` in inference, with
  ``b' = beta + g * b / s``. Outputs (after a fused ReLU/ReLU6) and the model's inputs are fake-quantized to
  asymmetric int8 ranges (``tf.quantization.fake_quant_with_min_max_vars``) that start at -6..6 and follow a
  moving average (decay 0.999) of the batch min/max, as tfmot's MovingAverageQuantizer does. (Starting from the
  first batch's range instead, with decay 0.99, measured 1-2 test images of 359 worse than tfmot on the digits
  CNN at each of 4 training lengths, this scheme -1 to +1: the narrower ranges clip more.)
- **Pruning** (Zhu & Gupta, "To prune, or not to prune", 2017): a mask per kernel keeps the
  ``round(n * (1 - s))`` largest-magnitude entries, recomputed every ``frequency`` steps (the first batch is
  step 1, as in tfmot) at the sparsity ``s``
  of a :class:`ConstantSparsity` or :class:`PolynomialDecay` schedule, the pruned weights set to zero; the
  forward pass uses ``kernel * mask``.
- **Clustering** (Han et al., "Deep Compression", ICLR 2016): k-means++ then Lloyd's iterations on each kernel's
  values give ``k`` centroids; the kernel is ``centroids[indices]`` with the indices fixed and the centroids
  trained (each one's gradient the sum of its weights' gradients).

:func:`strip` replaces the pruning and clustering wrappers by the plain layers holding the final kernels
(exactly the asked share of zeros; exactly ``k`` distinct values). A QAT model keeps its wrappers: their ranges
are what the int8 conversion reads.

What a technique cannot take (a layer kind outside its list, a layer called twice, a nested model,
``channels_first``) is one :class:`UnsupportedLayerError` naming the layer and what is supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tensorfleet.compat.keras import keras3, producing_layer_name
from tensorfleet.edge.errors import InvalidModelError
from tensorfleet.validation import integer, number

__all__ = ["ConstantSparsity", "PolynomialDecay", "UnsupportedLayerError", "WEIGHTED", "apply_clustering",
           "apply_pruning", "apply_qat", "custom_objects", "kmeans_1d", "pruning_callbacks", "pruning_mask", "strip"]

WEIGHTED = ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "Dense")
"""The layer kinds whose kernels the Keras 3 route quantizes, prunes and clusters."""
_LEFT_DENSE = ("BatchNormalization", "LayerNormalization")  # weighted, but neither pruned nor clustered (as tfmot)
_QAT_PASS = ("Dropout", "Flatten", "Reshape", "MaxPooling1D", "MaxPooling2D", "GlobalMaxPooling1D",
             "GlobalMaxPooling2D", "ZeroPadding2D", "Softmax")  # int8 keeps the input's range, or has a fixed one
_QAT_OUTPUT = ("Add", "Concatenate", "AveragePooling2D", "GlobalAveragePooling1D", "GlobalAveragePooling2D", "ReLU",
               "Activation")
_FUSED = ("linear", "relu", "relu6")         # TFLite fuses these into CONV_2D / FULLY_CONNECTED: quantize after
_FIXED_RANGE = ("softmax", "sigmoid", "tanh")  # int8 kernels with fixed output ranges: quantize before


class UnsupportedLayerError(InvalidModelError):
    """A Keras 3 model holds a layer the Keras 3 route of a technique cannot take; the message names it."""


# ---------------------------------------------------------------------------------------------------------------
# Pruning schedules and masks (pure NumPy: the math the tests check on its own)

@dataclass(frozen=True)
class ConstantSparsity:
    """``sparsity`` from ``begin_step`` on, the mask recomputed every ``frequency`` steps (tfmot's ConstantSparsity)."""

    sparsity: float
    begin_step: int = 0
    frequency: int = 100

    def __call__(self, step: int) -> float | None:
        """The sparsity to prune to at ``step``, or None when the mask is not recomputed then."""
        if step < self.begin_step or (step - self.begin_step) % self.frequency:
            return None
        return self.sparsity


@dataclass(frozen=True)
class PolynomialDecay:
    """Sparsity rising from ``initial_sparsity`` at ``begin_step`` to ``final_sparsity`` at ``end_step`` as
    ``final + (initial - final) * (1 - p) ** power``, ``p`` the fraction of the way (Zhu & Gupta; tfmot's
    PolynomialDecay); the mask recomputed every ``frequency`` steps in ``[begin_step, end_step]``."""

    initial_sparsity: float
    final_sparsity: float
    begin_step: int
    end_step: int
    power: float = 3.0
    frequency: int = 100

    def __call__(self, step: int) -> float | None:
        """The sparsity to prune to at ``step``, or None when the mask is not recomputed then."""
        if not self.begin_step <= step <= self.end_step or (step - self.begin_step) % self.frequency:
            return None
        p = (step - self.begin_step) / max(self.end_step - self.begin_step, 1)
        return self.final_sparsity + (self.initial_sparsity - self.final_sparsity) * (1.0 - p) ** self.power


def schedule_of(*, sparsity: float = 0.5, schedule: str = "constant", begin_step: int = 0, frequency: int = 10,
                initial_sparsity: float = 0.0, end_step: int | None = None, power: float = 3.0) -> Any:
    """The schedule ``apply_pruning``'s options describe (the same options for tfmot's schedules)."""
    number("sparsity", sparsity, above=0, below=1)
    integer("begin_step", begin_step, minimum=0)
    integer("frequency", frequency, minimum=1)
    if schedule == "constant":
        for name, value, default in (("initial_sparsity", initial_sparsity, 0.0), ("end_step", end_step, None),
                                     ("power", power, 3.0)):
            if value != default:
                raise ValueError(f"{name} applies to schedule='polynomial' only. Received: {name}={value!r} "
                                 f"with schedule='constant'")
        return ConstantSparsity(float(sparsity), begin_step, frequency)
    if schedule != "polynomial":
        raise ValueError(f"schedule must be 'constant' or 'polynomial'. Received: schedule={schedule!r}")
    number("initial_sparsity", initial_sparsity, minimum=0, below=1)
    number("power", power, above=0)
    if end_step is None:
        raise ValueError("schedule='polynomial' needs end_step= (the step at which sparsity reaches its final "
                         "value). Received: end_step=None")
    integer("end_step", end_step, minimum=begin_step + 1)
    return PolynomialDecay(float(initial_sparsity), float(sparsity), begin_step, end_step, float(power), frequency)


def pruning_mask(kernel: np.ndarray, sparsity: float) -> np.ndarray:
    """A 0/1 mask keeping the ``round(n * (1 - sparsity))`` largest ``|kernel|`` entries (ties: the first in
    C order), as tfmot counts them; the others are zero."""
    flat = np.abs(np.asarray(kernel, np.float32)).ravel()
    keep = int(round(flat.size * (1.0 - float(sparsity))))
    mask = np.zeros(flat.size, np.float32)
    if keep:
        mask[np.argsort(-flat, kind="stable")[:keep]] = 1.0
    return mask.reshape(np.shape(kernel))


def kmeans_1d(values: np.ndarray, k: int, *, seed: int = 0, iterations: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """``k`` centroids of ``values`` (k-means++ start, then Lloyd's iterations; an emptied cluster restarts at the
    value farthest from its centroid) and each value's centroid index.

    Raises:
        ValueError: ``values`` holds fewer than ``k`` distinct values.
    """
    x = np.asarray(values, np.float64).ravel()
    if np.unique(x).size < k:
        raise ValueError(f"cannot make {k} clusters of {np.unique(x).size} distinct values")
    rng = np.random.default_rng(seed)
    centroids = [x[rng.integers(x.size)]]
    for _ in range(1, k):
        d2 = np.min((x[:, None] - np.asarray(centroids)[None]) ** 2, axis=1)
        centroids.append(x[rng.choice(x.size, p=d2 / d2.sum())])
    c = np.sort(np.asarray(centroids))
    for _ in range(iterations):
        index = np.argmin(np.abs(x[:, None] - c[None]), axis=1)
        new = c.copy()
        for j in range(k):
            members = x[index == j]
            if members.size:
                new[j] = members.mean()
            else:
                far = int(np.argmax(np.abs(x - c[index])))
                new[j] = x[far]
                index[far] = j
        if np.array_equal(new, c):
            break
        c = np.sort(new)
    index = np.argmin(np.abs(x[:, None] - c[None]), axis=1)
    return c.astype(np.float32), index.reshape(np.shape(values)).astype(np.int32)


# ---------------------------------------------------------------------------------------------------------------
# The layer's own operation on a given kernel

def _kind(layer: Any) -> str:
    return type(layer).__name__


def _channels_last(layer: Any, technique: str) -> None:
    """Refuses what :func:`_linear` would compute differently from the layer: channels_first, causal padding."""
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        raise UnsupportedLayerError(f"{technique}: layer {layer.name!r} ({_kind(layer)}) has data_format="
                                    f"{layer.data_format!r}; the Keras 3 route takes channels_last layers")
    if getattr(layer, "padding", None) == "causal":
        raise UnsupportedLayerError(f"{technique}: layer {layer.name!r} ({_kind(layer)}) has padding='causal'; the "
                                    "Keras 3 route takes 'valid' and 'same' (pad with ZeroPadding1D before it)")


def _linear(layer: Any, x: Any, kernel: Any) -> Any:
    """``layer``'s operation without bias and activation, on ``kernel`` instead of its own."""
    ops = keras3().ops
    if _kind(layer) == "Dense":
        return ops.matmul(x, kernel)
    if _kind(layer) == "DepthwiseConv2D":
        return ops.depthwise_conv(x, kernel, strides=layer.strides, padding=layer.padding,
                                  dilation_rate=layer.dilation_rate, data_format=layer.data_format)
    return layer.convolution_op(x, kernel)


def _out_channels(kernel: Any, layer: Any) -> Any:
    """``kernel`` with its output channels last and the other axes first, flattened (depthwise: in * multiplier)."""
    import tensorflow as tf

    if _kind(layer) == "DepthwiseConv2D":
        shape = tf.shape(kernel)
        return tf.reshape(kernel, tf.concat([shape[:2], [shape[2] * shape[3]]], 0))
    return kernel


def _activation_name(layer: Any) -> str:
    activation = getattr(layer, "activation", None)
    return "linear" if activation is None else getattr(activation, "__name__", str(activation))


# ---------------------------------------------------------------------------------------------------------------
# Wrappers (Keras 3 layers). Their class names are tfmot's for pruning and clustering, which
# tensorfleet.edge.convert recognises and strips.

def _layer_classes() -> dict[str, type]:
    """The wrapper classes, defined on first use (they subclass Keras 3's ``Layer``; importing this module
    imports no Keras)."""
    if _CLASSES:
        return _CLASSES
    import tensorflow as tf

    keras = keras3()

    class _KernelWrapper(keras.layers.Wrapper):
        """Runs the wrapped layer's operation on ``self.kernel_for(training)``, then its bias and activation."""

        def call(self, inputs: Any, training: Any = None) -> Any:
            out = _linear(self.layer, inputs, self.kernel_for(training))
            if getattr(self.layer, "use_bias", False):
                out = out + self.layer.bias
            return self.layer.activation(out) if getattr(self.layer, "activation", None) is not None else out

        def compute_output_shape(self, input_shape: Any) -> Any:
            return self.layer.compute_output_shape(input_shape)

    class PruneLowMagnitude(_KernelWrapper):
        """The wrapped layer with ``kernel * mask`` (the mask from :func:`pruning_mask` at the sparsity ``schedule``
        gives, set by the callback of :func:`pruning_callbacks`)."""

        def __init__(self, layer: Any, schedule: Any = None, **kwargs: Any) -> None:
            super().__init__(layer, **kwargs)
            if isinstance(schedule, dict):
                kind = {"ConstantSparsity": ConstantSparsity, "PolynomialDecay": PolynomialDecay}[schedule["class"]]
                schedule = kind(**{k: v for k, v in schedule.items() if k != "class"})
            self.schedule = schedule

        def get_config(self) -> dict[str, Any]:
            from dataclasses import asdict

            return {**super().get_config(), "schedule": {"class": type(self.schedule).__name__,
                                                         **asdict(self.schedule)}}

        def build(self, input_shape: Any) -> None:
            if not self.layer.built:
                self.layer.build(input_shape)
            self.mask = self.add_weight(name="mask", shape=self.layer.kernel.shape, initializer="ones",
                                        trainable=False)
            self.pruning_step = self.add_weight(name="pruning_step", shape=(), initializer="zeros",
                                                dtype="int64", trainable=False)
            self.built = True

        def kernel_for(self, training: Any) -> Any:
            return self.layer.kernel * self.mask

        def stripped_kernel(self) -> np.ndarray:
            return np.asarray(self.layer.kernel.numpy() * self.mask.numpy())

    class ClusterWeights(_KernelWrapper):
        """The wrapped layer with ``centroids[indices]`` as its kernel: the centroids train, the indices do not."""

        def __init__(self, layer: Any, clusters: int = 8, **kwargs: Any) -> None:
            super().__init__(layer, **kwargs)
            self.clusters = int(clusters)

        def build(self, input_shape: Any) -> None:
            if not self.layer.built:
                self.layer.build(input_shape)
            self.layer.kernel.trainable = False  # the centroids are what trains
            self.centroids = self.add_weight(name="centroids", shape=(self.clusters,), initializer="zeros")
            self.indices = self.add_weight(name="indices", shape=self.layer.kernel.shape, initializer="zeros",
                                           dtype="int32", trainable=False)
            self.built = True

        def kernel_for(self, training: Any) -> Any:
            return tf.gather(self.centroids, self.indices)

        def stripped_kernel(self) -> np.ndarray:
            return np.asarray(self.centroids.numpy())[np.asarray(self.indices.numpy())]

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "clusters": self.clusters}

    class FakeQuant(keras.layers.Layer):
        """Asymmetric int8 fake quantization whose range starts at -6..6 and follows a moving average of the
        batch min/max (zero always inside), as tfmot's MovingAverageQuantizer."""

        def __init__(self, decay: float = 0.999, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.decay = float(decay)

        def build(self, input_shape: Any) -> None:
            self.range_min = self.add_weight(name="min", shape=(), initializer=keras.initializers.Constant(-6.0),
                                             trainable=False)
            self.range_max = self.add_weight(name="max", shape=(), initializer=keras.initializers.Constant(6.0),
                                             trainable=False)
            self.built = True

        def call(self, inputs: Any, training: Any = None) -> Any:
            if training:
                low = tf.minimum(tf.reduce_min(inputs), 0.0)
                high = tf.maximum(tf.reduce_max(inputs), 0.0)
                self.range_min.assign(self.decay * self.range_min + (1 - self.decay) * low)
                self.range_max.assign(self.decay * self.range_max + (1 - self.decay) * high)
            return tf.quantization.fake_quant_with_min_max_vars(inputs, self.range_min, self.range_max, num_bits=8)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "decay": self.decay}

    class QuantizeWeights(_KernelWrapper):
        """QAT of one Conv/Dense layer, with the BatchNormalization that follows it (if any) folded in before
        the kernel is fake-quantized; its output fake-quantized after a fused ReLU/ReLU6 (or before a
        softmax/sigmoid/tanh, whose int8 output range is fixed), or not at all when an activation layer
        follows (that one quantizes)."""

        def __init__(self, layer: Any, batch_norm: Any = None, quantize_output: bool = True, decay: float = 0.999,
                     **kwargs: Any) -> None:
            super().__init__(layer, **kwargs)
            if isinstance(batch_norm, dict):
                batch_norm = keras.layers.deserialize(batch_norm)
            self.batch_norm = batch_norm
            self.quantize_output = bool(quantize_output)
            self.decay = float(decay)
            self.output_quant = FakeQuant(decay, name="output_quant") if quantize_output else None

        def build(self, input_shape: Any) -> None:
            if not self.layer.built:
                self.layer.build(input_shape)
            if self.batch_norm is not None and not self.batch_norm.built:
                self.batch_norm.build(self.layer.compute_output_shape(input_shape))
            if self.output_quant is not None:
                self.output_quant.build(())
            self.built = True

        def _scale_kernel(self, kernel: Any, scale: Any) -> Any:
            if _kind(self.layer) == "DepthwiseConv2D":  # output channel c * multiplier + m
                return kernel * tf.reshape(scale, tf.shape(kernel)[2:])
            return kernel * scale

        @staticmethod
        def _quantize_kernel(kernel: Any, per_channel: bool) -> Any:
            if per_channel:
                axes = list(range(len(kernel.shape) - 1))
                bound = tf.reduce_max(tf.abs(kernel), axis=axes)
                return tf.quantization.fake_quant_with_min_max_vars_per_channel(kernel, -bound, bound, num_bits=8,
                                                                                 narrow_range=True)
            bound = tf.reduce_max(tf.abs(kernel))
            return tf.quantization.fake_quant_with_min_max_vars(kernel, -bound, bound, num_bits=8,
                                                                narrow_range=True)

        def call(self, inputs: Any, training: Any = None) -> Any:
            layer, bn = self.layer, self.batch_norm
            kernel = layer.kernel
            bias = layer.bias if getattr(layer, "use_bias", False) else 0.0
            correction = None
            if bn is not None:
                gamma = bn.gamma if bn.scale else 1.0
                beta = bn.beta if bn.center else 0.0
                sigma = tf.sqrt(bn.moving_variance + bn.epsilon)
                mean, std = bn.moving_mean, sigma
                if training:  # batch statistics of the float layer, as BatchNormalization would see them
                    raw = _linear(layer, inputs, kernel) + bias
                    axes = list(range(len(raw.shape) - 1))
                    mean, variance = tf.nn.moments(raw, axes)
                    std = tf.sqrt(variance + bn.epsilon)
                    m = bn.momentum
                    bn.moving_mean.assign(bn.moving_mean * m + mean * (1 - m))
                    bn.moving_variance.assign(bn.moving_variance * m + variance * (1 - m))
                    correction = sigma / std
                kernel = self._scale_kernel(kernel, gamma / sigma)
                bias = beta + gamma * (bias - mean) / std
            shaped = _out_channels(kernel, layer)
            quantized = self._quantize_kernel(shaped, per_channel=_kind(layer) != "Dense")
            out = _linear(layer, inputs, tf.reshape(quantized, tf.shape(kernel)))
            if correction is not None:
                out = out * correction
            out = out + bias
            activation = _activation_name(layer)
            if activation in _FIXED_RANGE:
                out = self.output_quant(out, training=training) if self.output_quant is not None else out
                return layer.activation(out)
            out = layer.activation(out) if activation != "linear" else out
            return self.output_quant(out, training=training) if self.output_quant is not None else out

        def compute_output_shape(self, input_shape: Any) -> Any:
            return self.layer.compute_output_shape(input_shape)

        def get_config(self) -> dict[str, Any]:
            bn = None if self.batch_norm is None else keras.layers.serialize(self.batch_norm)
            return {**super().get_config(), "batch_norm": bn, "quantize_output": self.quantize_output,
                    "decay": self.decay}

    for cls in (PruneLowMagnitude, ClusterWeights, FakeQuant, QuantizeWeights):
        _CLASSES[cls.__name__] = keras.saving.register_keras_serializable(package="tensorfleet")(cls)
    return _CLASSES


_CLASSES: dict[str, type] = {}


def custom_objects() -> dict[str, type]:
    """The wrapper classes by name, for loading a saved model that holds them in a new process (as tfmot's
    ``quantize_scope``): ``keras.models.load_model(path, custom_objects=custom_objects())``."""
    return dict(_layer_classes())


# ---------------------------------------------------------------------------------------------------------------
# Rebuilding a model's graph

def _copy_layer(layer: Any) -> Any:
    """A new layer of ``layer``'s class and config (its weights set after it is built)."""
    return type(layer).from_config(layer.get_config())


def _graph(model: Any, technique: str) -> list[tuple[Any, Any, list[str]]]:
    """``(layer, its input tensors, the names of the layers it reads)`` for each layer of ``model`` in order.

    Raises:
        UnsupportedLayerError: a nested model, or a layer called more than once.
    """
    keras = keras3()
    nodes = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if isinstance(layer, keras.Model):
            raise UnsupportedLayerError(f"{technique}: layer {layer.name!r} is a nested model; the Keras 3 route "
                                        "takes a flat functional or Sequential model (build one from its layers)")
        try:
            inputs = layer.input
        except (AttributeError, ValueError) as error:
            raise UnsupportedLayerError(f"{technique}: layer {layer.name!r} ({_kind(layer)}) is called more than "
                                        f"once (shared) or never ({error}); the Keras 3 route takes layers called "
                                        "once") from None
        flat = keras.tree.flatten(inputs)
        nodes.append((layer, inputs, [producing_layer_name(t) for t in flat]))
    return nodes


def _rebuild(model: Any, technique: str, call: Callable[[Any, Any], Any], copy_weights: Callable[[], None]
             ) -> Any:
    """A functional model like ``model`` in which ``call(layer, new_inputs)`` gives each layer's new output."""
    keras = keras3()
    new_inputs = [keras.Input(batch_shape=tuple(t.shape), dtype=t.dtype, name=producing_layer_name(t))
                  for t in model.inputs]
    tensors = {id(old): new for old, new in zip(model.inputs, new_inputs)}
    for layer, inputs, _ in _graph(model, technique):
        out = call(layer, keras.tree.map_structure(lambda t: tensors[id(t)], inputs))
        tensors[id(layer.output)] = out
    outputs = keras.tree.map_structure(lambda t: tensors[id(t)], model.outputs)
    rebuilt = keras.Model(new_inputs[0] if len(new_inputs) == 1 else new_inputs,
                          outputs[0] if len(outputs) == 1 else outputs, name=model.name)
    copy_weights()
    return rebuilt


def _copy_weights(pairs: list[tuple[Any, Any]]) -> None:
    """Sets each new layer's weights to its old layer's."""
    for new, old in pairs:
        new.set_weights(old.get_weights())


def _wrap_weighted(model: Any, technique: str, make: Callable[[Any], Any]) -> Any:
    """``model`` with each layer of :data:`WEIGHTED` kinds wrapped by ``make(copy)``, the rest copied."""
    pairs: list[tuple[Any, Any]] = []

    def call(layer: Any, inputs: Any) -> Any:
        if _kind(layer) in WEIGHTED:
            _channels_last(layer, technique)
            new = make(_copy_layer(layer))
            out = new(inputs)
            pairs.append((new.layer, layer))
            return out
        if layer.weights and _kind(layer) not in _LEFT_DENSE:
            raise UnsupportedLayerError(
                f"{technique}: layer {layer.name!r} ({_kind(layer)}) has weights the Keras 3 route cannot "
                f"{technique}; it takes {', '.join(WEIGHTED)} (and leaves {', '.join(_LEFT_DENSE)} as they are)")
        new = _copy_layer(layer)
        out = new(inputs)
        pairs.append((new, layer))
        return out

    return _rebuild(model, technique, call, lambda: _copy_weights(pairs))


def apply_pruning(model: Any, schedule: Any) -> Any:
    """``model`` (Keras 3) with a :class:`PruneLowMagnitude` wrapper on each weighted layer, pruned by ``schedule``
    while :func:`pruning_callbacks` run in ``fit``."""
    cls = _layer_classes()["PruneLowMagnitude"]
    return _wrap_weighted(model, "prune", lambda layer: cls(layer, schedule, name=f"prune_{layer.name}"))


def pruning_callbacks(model: Any) -> list[Any]:
    """The Keras 3 callback that counts steps and recomputes the masks on the schedule's steps (tfmot's
    ``UpdatePruningStep``)."""
    keras = keras3()
    wrapper = _layer_classes()["PruneLowMagnitude"]

    class UpdatePruningStep(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            for layer in self.model.layers:
                if not isinstance(layer, wrapper):
                    continue
                step = int(layer.pruning_step.numpy()) + 1   # the first batch is step 1, as in tfmot
                layer.pruning_step.assign(step)
                sparsity = layer.schedule(step)
                if sparsity is not None:  # pruned weights set to zero, as tfmot does: once pruned, they stay
                    kernel = layer.layer.kernel.numpy() * layer.mask.numpy()
                    mask = pruning_mask(kernel, sparsity)
                    layer.mask.assign(mask)
                    layer.layer.kernel.assign(kernel * mask)

    return [UpdatePruningStep()]


def apply_clustering(model: Any, clusters: int, *, seed: int = 0) -> Any:
    """``model`` (Keras 3) with a :class:`ClusterWeights` wrapper on each weighted layer: ``clusters`` k-means
    centroids per kernel, each weight tied to its nearest.

    Raises:
        UnsupportedLayerError: a kernel with fewer than ``clusters`` distinct values.
    """
    cls = _layer_classes()["ClusterWeights"]
    wrapped = _wrap_weighted(model, "cluster", lambda layer: cls(layer, clusters, name=f"cluster_{layer.name}"))
    for layer in wrapped.layers:
        if isinstance(layer, cls):
            try:
                centroids, index = kmeans_1d(layer.layer.kernel.numpy(), clusters, seed=seed)
            except ValueError as error:
                raise UnsupportedLayerError(f"cluster: layer {layer.layer.name!r}: {error}; ask for fewer "
                                            f"clusters. Received: clusters={clusters}") from None
            layer.centroids.assign(centroids)
            layer.indices.assign(index)
    return wrapped


def strip(model: Any) -> Any:
    """``model`` (Keras 3) with its pruning and clustering wrappers replaced by the plain layers holding the final
    kernels (``kernel * mask``, ``centroids[indices]``); other layers copied as they are."""
    classes = _layer_classes()
    wrappers = (classes["PruneLowMagnitude"], classes["ClusterWeights"])
    pairs: list[tuple[Any, Any]] = []

    def call(layer: Any, inputs: Any) -> Any:
        inner = layer.layer if isinstance(layer, wrappers) else layer
        new = _copy_layer(inner)
        out = new(inputs)
        pairs.append((new, layer))
        return out

    def copy_weights() -> None:
        for new, old in pairs:
            if isinstance(old, wrappers):
                weights = old.layer.get_weights()
                weights[0] = old.stripped_kernel()  # Conv/Dense: the kernel first, then the bias
                new.set_weights(weights)
            else:
                new.set_weights(old.get_weights())

    return _rebuild(model, "strip", call, copy_weights)


def apply_qat(model: Any, *, decay: float = 0.999) -> Any:
    """``model`` (Keras 3) ready for quantization-aware training: inputs and outputs fake-quantized, weighted layers
    wrapped by ``QuantizeWeights`` with a following BatchNormalization folded in.

    Raises:
        UnsupportedLayerError: a layer outside what int8 QAT here takes (the message lists them).
    """
    number("decay", decay, above=0, below=1)
    keras = keras3()
    classes = _layer_classes()
    nodes = _graph(model, "qat")
    readers: dict[str, list[Any]] = {}
    for layer, _, sources in nodes:
        for source in sources:
            readers.setdefault(source, []).append(layer)
    input_names = {producing_layer_name(t) for t in model.inputs}
    output_names = {producing_layer_name(t) for t in model.outputs}

    def only_reader(layer: Any) -> Any:
        found = readers.get(layer.name, [])
        return found[0] if len(found) == 1 and layer.name not in output_names else None

    folded: dict[str, Any] = {}   # BatchNormalization name -> the weighted layer it folds into
    for layer, _, _ in nodes:
        next_layer = only_reader(layer)
        if _kind(layer) in WEIGHTED and next_layer is not None and _kind(next_layer) == "BatchNormalization":
            if _activation_name(layer) != "linear":
                raise UnsupportedLayerError(
                    f"qat: BatchNormalization {next_layer.name!r} follows {layer.name!r}, whose activation "
                    f"{_activation_name(layer)!r} comes before it; folding needs activation=None on the layer "
                    "(put the activation after the BatchNormalization)")
            if tuple(np.atleast_1d(next_layer.axis)) not in ((-1,), (len(layer.output.shape) - 1,)):
                raise UnsupportedLayerError(f"qat: BatchNormalization {next_layer.name!r} normalizes axis "
                                            f"{next_layer.axis}; folding takes the channel axis (-1)")
            folded[next_layer.name] = layer
    pairs: list[tuple[Any, Any]] = []
    quantized_inputs: dict[int, Any] = {}

    def activation_follows(layer: Any) -> bool:
        after = only_reader(layer)
        if after is not None and after.name in folded:
            after = only_reader(after)
        return after is not None and (_kind(after) == "ReLU" or (_kind(after) == "Activation"
                                                                 and _activation_name(after) in ("relu", "relu6")))

    def call(layer: Any, inputs: Any) -> Any:
        kind = _kind(layer)
        for t in keras.tree.flatten(inputs):   # the model's inputs are quantized once, where first read
            if producing_layer_name(t) in input_names and id(t) not in quantized_inputs:
                quantized_inputs[id(t)] = classes["FakeQuant"](decay, name=f"quant_{producing_layer_name(t)}")(t)
        inputs = keras.tree.map_structure(lambda t: quantized_inputs.get(id(t), t), inputs)
        if layer.name in folded:
            return inputs   # folded into the layer before it
        if kind in WEIGHTED:
            _channels_last(layer, "qat")
            activation = _activation_name(layer)
            if activation not in _FUSED + _FIXED_RANGE:
                raise UnsupportedLayerError(
                    f"qat: layer {layer.name!r} ({kind}) has activation {activation!r}; int8 QAT here takes "
                    f"{', '.join(_FUSED + _FIXED_RANGE)} (or put the activation in a layer of its own)")
            bn_name = next((name for name, source in folded.items() if source is layer), None)
            bn = _copy_layer(model.get_layer(bn_name)) if bn_name else None
            new = classes["QuantizeWeights"](_copy_layer(layer), batch_norm=bn, decay=decay,
                                             quantize_output=not activation_follows(layer), name=f"quant_{layer.name}")
            out = new(inputs)
            pairs.append((new.layer, layer))
            if bn is not None:
                pairs.append((bn, model.get_layer(bn_name)))
            return out
        if kind == "Activation" and _activation_name(layer) not in ("relu", "relu6", "linear") + _FIXED_RANGE:
            raise UnsupportedLayerError(f"qat: layer {layer.name!r} is Activation({_activation_name(layer)!r}); int8 "
                                        f"QAT here takes relu, relu6, linear, softmax, sigmoid, tanh")
        if kind not in _QAT_PASS + _QAT_OUTPUT:
            where = (" (a BatchNormalization folds only right after a Conv/Dense layer that it alone reads, "
                     "with activation=None)" if kind == "BatchNormalization" else "")
            raise UnsupportedLayerError(
                f"qat: layer {layer.name!r} ({kind}) is not supported by the Keras 3 QAT route{where}. It takes "
                f"{', '.join(WEIGHTED)} (a BatchNormalization after one folded in), {', '.join(_QAT_OUTPUT)} and "
                f"{', '.join(_QAT_PASS)}. For other layers use tf_keras with tfmot, or convert with "
                "quantization='int8' after plain training")
        new = _copy_layer(layer)
        out = new(inputs)
        pairs.append((new, layer))
        fixed = kind == "Softmax" or (kind == "Activation" and _activation_name(layer) in _FIXED_RANGE)
        if kind in _QAT_OUTPUT and not fixed:
            out = classes["FakeQuant"](decay, name=f"quant_{layer.name}")(out)
        return out

    return _rebuild(model, "qat", call, lambda: _copy_weights(pairs))
