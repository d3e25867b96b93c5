"""The Keras 3 route's wrapper layers: pruning (``PruneLowMagnitude``), clustering (``ClusterWeights``) and
quantization-aware training (``FakeQuant``, ``QuantizeWeights``), registered with Keras 3's serialization so a
model saved with them loads again (:func:`custom_objects`). Their class names are tfmot's for pruning and
clustering, which :mod:`tensorfleet.edge.convert` recognises and strips.

This module imports Keras 3: :mod:`tensorfleet.edge.keras3_optimize` imports it when a technique first runs,
so importing the edge imports no Keras.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tensorfleet.compat.keras import keras3
from tensorfleet.edge.keras3_optimize import FIXED_RANGE, activation_name, kind_of, linear_op, out_channels
from tensorfleet.edge.sparsity import ConstantSparsity, PolynomialDecay

__all__ = ["CLASSES", "ClusterWeights", "FakeQuant", "PruneLowMagnitude", "QuantizeWeights", "custom_objects"]

keras: Any = keras3()  # a module mypy cannot follow: its classes are bases here


class _KernelWrapper(keras.layers.Wrapper):
    """Runs the wrapped layer's operation on ``self.kernel_for(training)``, then its bias and activation."""

    def call(self, inputs: Any, training: Any = None) -> Any:
        out = linear_op(self.layer, inputs, self.kernel_for(training))
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
        if kind_of(self.layer) == "DepthwiseConv2D":  # output channel c * multiplier + m
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
                raw = linear_op(layer, inputs, kernel) + bias
                axes = list(range(len(raw.shape) - 1))
                mean, variance = tf.nn.moments(raw, axes)
                std = tf.sqrt(variance + bn.epsilon)
                m = bn.momentum
                bn.moving_mean.assign(bn.moving_mean * m + mean * (1 - m))
                bn.moving_variance.assign(bn.moving_variance * m + variance * (1 - m))
                correction = sigma / std
            kernel = self._scale_kernel(kernel, gamma / sigma)
            bias = beta + gamma * (bias - mean) / std
        shaped = out_channels(kernel, layer)
        quantized = self._quantize_kernel(shaped, per_channel=kind_of(layer) != "Dense")
        out = linear_op(layer, inputs, tf.reshape(quantized, tf.shape(kernel)))
        if correction is not None:
            out = out * correction
        out = out + bias
        activation = activation_name(layer)
        if activation in FIXED_RANGE:
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


CLASSES: dict[str, type] = {cls.__name__: keras.saving.register_keras_serializable(package="tensorfleet")(cls)
                            for cls in (PruneLowMagnitude, ClusterWeights, FakeQuant, QuantizeWeights)}
"""The wrapper classes by name."""


def custom_objects() -> dict[str, type]:
    """The wrapper classes by name, for loading a saved model that holds them in a new process (as tfmot's
    ``quantize_scope``): ``keras.models.load_model(path, custom_objects=custom_objects())``."""
    return dict(CLASSES)
