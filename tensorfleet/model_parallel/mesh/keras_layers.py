"""Keras layers whose computation TF 2.14's DTensor cannot lay out as Keras writes it, computed on a mesh
with the same maths in ops it can lay out.

When a weight of such a layer is laid out (:meth:`.keras_layout.KerasLayout.weight`), :func:`adapt`
gives that layer (that instance only, so only models built inside ``mesh.scope()``) a ``call`` of
the same maths:

- **DepthwiseConv2D**. DTensor convolves only with a replicated filter, and its gradient
  ``DepthwiseConv2dNativeBackpropFilter`` has no layout propagation at all. On the mesh the
  convolution is the sum over kernel taps of strided slices of the (padded) input times that tap's
  per-channel weights: elementwise ops, split along channels like the kernel (``channels`` rule),
  with gradients DTensor lays out. The input is first gathered along channels (DTensor's layout
  propagation would otherwise ask a Concatenate before it to split its concatenated axis, which
  DTensor refuses); a Concatenate along channels *after* a split layer still fails on a mesh.
- **Pooling and Concatenate.** DTensor pools only tensors split along the batch alone ("All operands
  and outputs must be batch parallel") and refuses to concatenate along a split axis; on the mesh
  their inputs are gathered to be split along the batch alone first. These layers have no weight,
  so the trainer (not the layout) adapts them, with the mesh: exactly those that read a tensor split
  along another axis than the batch (:func:`adapt_split_readers`). Relaying out every pooling layer
  broke a CNN whose pooled images were split along the batch alone ("SPMD expansion resulted in op
  output inconsistent with the provided layout").
- **Dropout** (and the dropout inside MultiHeadAttention). Keras draws the keep mask from the
  layer's ``tf.random.Generator`` with the shape of the input; DTensor expands a random op whose
  output is split by giving each shard a key derived from its mesh coordinates, so the mesh's mask
  is not one device's. On the mesh the uniform draw is relaid out to be whole on every device
  (DTensor then draws the full tensor with the unchanged key, as one device does) and each device
  keeps its part: the same mask as a one-device run whose Keras uses a ``tf.random.Generator`` for
  its random layers too (``tf.keras.backend.experimental.enable_tf_random_generator()``) with the
  same layer seed.
"""

from __future__ import annotations

import dataclasses
import types
import weakref
from typing import Any

from tensorfleet.compat.keras import keras2
from tensorfleet.compat.tf_keras import (
    dropout_generator,
    dropout_noise_shape,
    inbound_layers,
    is_graph_network,
    learning_phase,
    producing_layer,
    smart_cond,
)

__all__ = ["Adaptation", "adapt", "adapt_split_readers", "adaptation", "depthwise_conv2d"]


@dataclasses.dataclass(frozen=True)
class Adaptation:
    """What an adapted layer's mesh ``call`` needs beside the layer: the batch's mesh dimension, the DTensor mesh
    (``None`` for a layer adapted without one: DepthwiseConv2D and Dropout read theirs from their weights)."""

    batch_axis: str | None
    mesh: Any


# The layers given a mesh call, and its settings; kept beside the layer, not on it (Keras tracks attributes).
_ADAPTED: "weakref.WeakKeyDictionary[Any, Adaptation]" = weakref.WeakKeyDictionary()


def adaptation(layer: Any) -> Adaptation | None:
    """How :func:`adapt` adapted ``layer`` (``None``: it did not)."""
    return _ADAPTED.get(layer)


def adapt(layer: Any, batch_axis: str | None = None, mesh: Any = None) -> bool:
    """Gives ``layer`` a ``call`` DTensor can lay out if it needs one (DepthwiseConv2D, Dropout; with
    the DTensor ``mesh`` also pooling and Concatenate, which have no weight to name the mesh);
    returns whether it did. ``batch_axis``: the mesh dimension the batch is split over. Idempotent."""

    layers = keras2().layers
    if layer in _ADAPTED:
        return True
    if mesh is not None and isinstance(layer, _batch_parallel()):
        call = _batch_split_call
    elif isinstance(layer, layers.DepthwiseConv2D) and layer.data_format == "channels_last":
        call = _depthwise_call
    elif isinstance(layer, layers.Dropout):
        call = _dropout_call
    else:
        return False
    _ADAPTED[layer] = Adaptation(batch_axis, mesh)
    # The instance's own attribute: Keras' __call__ looks up self.call on every call after the build.
    object.__setattr__(layer, "call", types.MethodType(call, layer))
    return True


def adapt_split_readers(model: Any, decided: Any, batch_axis: str | None, mesh: Any) -> list[str]:
    """Adapts (:func:`adapt`, with the DTensor ``mesh``) each pooling or Concatenate layer of ``model``
    that reads a tensor split along an axis other than the batch; returns their names, in graph order.

    Which tensors are split follows the weights' layouts (``decided``: :attr:`.KerasLayout.decided`):
    a Dense, EinsumDense, Embedding or DepthwiseConv2D whose output units (columns, channels) are
    split outputs a split tensor; a layer without weights (activations, Dropout, Add, Flatten, ...)
    and a normalization pass on what they read; an adapted layer outputs the batch split alone, and
    any other layer with weights is taken to output whole (DTensor gathers for it)."""
    axes = {w.path: w.mesh_axes for w in decided}
    return _walk(model, axes, batch_axis, mesh, [False] * len(getattr(model, "inputs", None) or []), [])[1]


def _walk(model: Any, axes: dict[str, Any], batch_axis: str | None, mesh: Any, inputs_split: list[bool],
          adapted: list[str]) -> tuple[list[bool], list[str]]:
    """The walk of :func:`adapt_split_readers` over ``model`` whose inputs are split as ``inputs_split``:
    whether each of its outputs is split, and the names adapted so far."""
    split: dict[int, bool] = {}
    if is_graph_network(model):
        for tensor, flag in zip(model.inputs, inputs_split):
            split[id(producing_layer(tensor))] = flag
        for layer in model.layers:  # in graph order
            if id(layer) in split:
                continue
            read = [split.get(id(inbound), False) for inbound in inbound_layers(layer)]
            split[id(layer)] = _output_split(layer, read, axes, batch_axis, mesh, adapted)
        return [split.get(id(producing_layer(t)), False) for t in model.outputs], adapted
    flag = any(inputs_split)  # a Sequential built without an Input: a chain
    for layer in getattr(model, "layers", []):
        flag = _output_split(layer, [flag], axes, batch_axis, mesh, adapted)
    return [flag], adapted


def _output_split(layer: Any, read: list[bool], axes: dict[str, Any], batch_axis: str | None, mesh: Any,
                  adapted: list[str]) -> bool:

    layers = keras2().layers
    if isinstance(layer, keras2().Model):
        return any(_walk(layer, axes, batch_axis, mesh, read, adapted)[0])
    if isinstance(layer, _batch_parallel()):
        if any(read) and adapt(layer, batch_axis, mesh):
            adapted.append(layer.name)
        return False
    produced = {"kernel": -1, "bias": -1, "embeddings": -1, "depthwise_kernel": 2}
    if isinstance(layer, (layers.Dense, layers.EinsumDense, layers.Embedding, layers.DepthwiseConv2D)):
        for weight in layer.weights:
            path, name = weight.name.split(":")[0], weight.name.split(":")[0].rsplit("/", 1)[-1]
            mesh_axes = axes.get(path)
            if name in produced and mesh_axes and mesh_axes[produced[name]] not in (None, batch_axis):
                return True
        return False
    if layer.weights and not isinstance(layer, (layers.LayerNormalization, layers.BatchNormalization)):
        return False
    return any(read)


def _batch_parallel() -> tuple[Any, ...]:

    layers = keras2().layers
    return (layers.MaxPooling1D, layers.AveragePooling1D, layers.MaxPooling2D, layers.AveragePooling2D,
            layers.Concatenate)


def _batch_split_call(self: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    adaptation = _ADAPTED[self]

    def batch_only(tensor: Any) -> Any:
        spec = [adaptation.batch_axis or dtensor.UNSHARDED] + [dtensor.UNSHARDED] * (tensor.shape.rank - 1)
        return dtensor.relayout(tensor, dtensor.Layout(spec, adaptation.mesh))

    return type(self).call(self, tf.nest.map_structure(batch_only, inputs), *args, **kwargs)


def depthwise_conv2d(x: Any, kernel: Any, strides: tuple[int, int], padding: str,
                     dilation_rate: tuple[int, int]) -> Any:
    """``tf.nn.depthwise_conv2d`` of NHWC ``x`` (static height and width) with ``kernel`` of shape
    ``(kh, kw, channels, multiplier)``, as a sum over the kernel's taps of strided slices times
    per-channel weights; output channel ``c * multiplier + q`` as TensorFlow orders them."""
    import tensorflow as tf

    kh, kw, channels, multiplier = (int(s) for s in kernel.shape)
    (sh, sw), (dh, dw) = strides, dilation_rate
    height, width = int(x.shape[1]), int(x.shape[2])
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if padding.lower() == "same":
        out_h, out_w = -(-height // sh), -(-width // sw)
        pad_h = max((out_h - 1) * sh + span_h - height, 0)
        pad_w = max((out_w - 1) * sw + span_w - width, 0)
        # TensorFlow's SAME: the odd pixel goes after. Zeros concatenated, not tf.pad: DTensor pads only
        # where the padded tensor's layout equals its input's, which its layout propagation may not choose.
        x = _zero_pad(x, 1, pad_h // 2, pad_h - pad_h // 2)
        x = _zero_pad(x, 2, pad_w // 2, pad_w - pad_w // 2)
    else:
        out_h, out_w = (height - span_h) // sh + 1, (width - span_w) // sw + 1
    outputs = []
    for q in range(multiplier):
        total = None
        for i in range(kh):
            for j in range(kw):
                tap = x[:, i * dh:i * dh + (out_h - 1) * sh + 1:sh, j * dw:j * dw + (out_w - 1) * sw + 1:sw, :]
                term = tap * kernel[i, j, :, q]
                total = term if total is None else total + term
        outputs.append(total)
    if multiplier == 1:
        return outputs[0]
    return tf.reshape(tf.stack(outputs, axis=-1), [-1, out_h, out_w, channels * multiplier])


def _zero_pad(x: Any, axis: int, before: int, after: int) -> Any:
    import tensorflow as tf

    if not before and not after:
        return x
    zero = tf.zeros_like(tf.gather(x, [0], axis=axis))
    return tf.concat([zero] * before + [x] + [zero] * after, axis=axis)


def _depthwise_call(self: Any, inputs: Any) -> Any:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    kernel_layout = getattr(self.depthwise_kernel, "layout", None)
    if kernel_layout is not None:
        # The input whole along channels (split along the batch only): DTensor's layout propagation
        # would otherwise ask the layer before to split its output along channels as the kernel is,
        # which a Concatenate over channels cannot do ("concat dimension in sharded dimension").
        spec = [_ADAPTED[self].batch_axis or dtensor.UNSHARDED] + [dtensor.UNSHARDED] * 3
        inputs = dtensor.relayout(inputs, dtensor.Layout(spec, kernel_layout.mesh))
    outputs = depthwise_conv2d(inputs, self.depthwise_kernel, tuple(self.strides), self.padding,
                               tuple(self.dilation_rate))
    if self.use_bias:
        outputs = tf.nn.bias_add(outputs, self.bias)
    return self.activation(outputs) if self.activation is not None else outputs


def _dropout_call(self: Any, inputs: Any, training: Any = None) -> Any:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    generator = None if isinstance(self.rate, (int, float)) and self.rate == 0 else dropout_generator(self)
    if generator is None:
        return type(self).call(self, inputs, training=training)
    if training is None:
        training = learning_phase()

    def uniform(shape: Any, dtype: Any) -> Any:
        values = generator.uniform(shape, dtype=dtype)
        state = getattr(generator.state, "layout", None)  # the generator's DVariable names the mesh
        if state is None:
            return values
        return dtensor.relayout(values, dtensor.Layout.replicated(state.mesh, rank=values.shape.rank))

    def dropped() -> Any:
        return tf.nn.experimental.general_dropout(inputs, rate=self.rate, noise_shape=dropout_noise_shape(self, inputs),
                                                  uniform_sampler=uniform)

    return smart_cond(training, dropped, lambda: tf.identity(inputs))
