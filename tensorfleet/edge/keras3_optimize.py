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

from typing import Any, Callable

import numpy as np

from tensorfleet.compat.keras import keras3, producing_layer_name
from tensorfleet.edge.errors import InvalidModelError
from tensorfleet.edge.sparsity import ConstantSparsity, PolynomialDecay, kmeans_1d, pruning_mask, schedule_of
from tensorfleet.validation import number

__all__ = ["ConstantSparsity", "PolynomialDecay", "UnsupportedLayerError", "WEIGHTED", "apply_clustering",
           "apply_pruning", "apply_qat", "custom_objects", "kmeans_1d", "pruning_callbacks", "pruning_mask",
           "schedule_of", "strip"]

WEIGHTED = ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "Dense")
"""The layer kinds whose kernels the Keras 3 route quantizes, prunes and clusters."""
_LEFT_DENSE = ("BatchNormalization", "LayerNormalization")  # weighted, but neither pruned nor clustered (as tfmot)
_QAT_PASS = ("Dropout", "Flatten", "Reshape", "MaxPooling1D", "MaxPooling2D", "GlobalMaxPooling1D",
             "GlobalMaxPooling2D", "ZeroPadding2D", "Softmax")  # int8 keeps the input's range, or has a fixed one
_QAT_OUTPUT = ("Add", "Concatenate", "AveragePooling2D", "GlobalAveragePooling1D", "GlobalAveragePooling2D", "ReLU",
               "Activation")
_FUSED = ("linear", "relu", "relu6")         # TFLite fuses these into CONV_2D / FULLY_CONNECTED: quantize after
FIXED_RANGE = ("softmax", "sigmoid", "tanh")  # int8 kernels with fixed output ranges: quantize before


class UnsupportedLayerError(InvalidModelError):
    """A Keras 3 model holds a layer the Keras 3 route of a technique cannot take; the message names it."""


def kind_of(layer: Any) -> str:
    return type(layer).__name__


def check_channels_last(layer: Any, technique: str) -> None:
    """Refuses what :func:`linear_op` would compute differently from the layer: channels_first, causal padding."""
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        raise UnsupportedLayerError(f"{technique}: layer {layer.name!r} ({kind_of(layer)}) has data_format="
                                    f"{layer.data_format!r}; the Keras 3 route takes channels_last layers")
    if getattr(layer, "padding", None) == "causal":
        raise UnsupportedLayerError(f"{technique}: layer {layer.name!r} ({kind_of(layer)}) has padding='causal'; the "
                                    "Keras 3 route takes 'valid' and 'same' (pad with ZeroPadding1D before it)")


def linear_op(layer: Any, x: Any, kernel: Any) -> Any:
    """``layer``'s operation without bias and activation, on ``kernel`` instead of its own."""
    ops = keras3().ops
    if kind_of(layer) == "Dense":
        return ops.matmul(x, kernel)
    if kind_of(layer) == "DepthwiseConv2D":
        return ops.depthwise_conv(x, kernel, strides=layer.strides, padding=layer.padding,
                                  dilation_rate=layer.dilation_rate, data_format=layer.data_format)
    return layer.convolution_op(x, kernel)


def out_channels(kernel: Any, layer: Any) -> Any:
    """``kernel`` with its output channels last and the other axes first, flattened (depthwise: in * multiplier)."""
    import tensorflow as tf

    if kind_of(layer) == "DepthwiseConv2D":
        shape = tf.shape(kernel)
        return tf.reshape(kernel, tf.concat([shape[:2], [shape[2] * shape[3]]], 0))
    return kernel


def activation_name(layer: Any) -> str:
    activation = getattr(layer, "activation", None)
    return "linear" if activation is None else getattr(activation, "__name__", str(activation))


# ---------------------------------------------------------------------------------------------------------------
# Wrappers (Keras 3 layers): tensorfleet.edge.keras3_layers, imported on first use

def _layer_classes() -> dict[str, Any]:
    """The wrapper classes (importing :mod:`tensorfleet.edge.keras3_layers` imports Keras 3). Typed ``Any``:
    they derive from Keras 3's layers, whose attributes (``layer``, ``mask``, ...) mypy cannot see."""
    from tensorfleet.edge import keras3_layers

    return keras3_layers.CLASSES


def custom_objects() -> dict[str, type]:
    """The wrapper classes by name, for loading a saved model that holds them in a new process (as tfmot's
    ``quantize_scope``): ``keras.models.load_model(path, custom_objects=custom_objects())``."""
    return dict(_layer_classes())


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
            raise UnsupportedLayerError(f"{technique}: layer {layer.name!r} ({kind_of(layer)}) is called more than "
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
        if kind_of(layer) in WEIGHTED:
            check_channels_last(layer, technique)
            new = make(_copy_layer(layer))
            out = new(inputs)
            pairs.append((new.layer, layer))
            return out
        if layer.weights and kind_of(layer) not in _LEFT_DENSE:
            raise UnsupportedLayerError(
                f"{technique}: layer {layer.name!r} ({kind_of(layer)}) has weights the Keras 3 route cannot "
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
    keras: Any = keras3()  # Keras 3's Callback is a base class here; mypy cannot follow the module
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


def _foldable(nodes: list[tuple[Any, Any, list[str]]], only_reader: Callable[[Any], Any]) -> dict[str, Any]:
    """The BatchNormalization layers QAT folds into the weighted layer they alone follow, by name (that layer's
    activation linear, the channel axis normalized; else one error)."""
    folded: dict[str, Any] = {}
    for layer, _, _ in nodes:
        next_layer = only_reader(layer)
        if kind_of(layer) in WEIGHTED and next_layer is not None and kind_of(next_layer) == "BatchNormalization":
            if activation_name(layer) != "linear":
                raise UnsupportedLayerError(
                    f"qat: BatchNormalization {next_layer.name!r} follows {layer.name!r}, whose activation "
                    f"{activation_name(layer)!r} comes before it; folding needs activation=None on the layer "
                    "(put the activation after the BatchNormalization)")
            if tuple(np.atleast_1d(next_layer.axis)) not in ((-1,), (len(layer.output.shape) - 1,)):
                raise UnsupportedLayerError(f"qat: BatchNormalization {next_layer.name!r} normalizes axis "
                                            f"{next_layer.axis}; folding takes the channel axis (-1)")
            folded[next_layer.name] = layer
    return folded


def _check_qat_layer(layer: Any, kind: str) -> None:
    """Refuses a layer that is neither weighted nor one the QAT route passes through or quantizes after."""
    if kind == "Activation" and activation_name(layer) not in ("relu", "relu6", "linear") + FIXED_RANGE:
        raise UnsupportedLayerError(f"qat: layer {layer.name!r} is Activation({activation_name(layer)!r}); int8 "
                                    f"QAT here takes relu, relu6, linear, softmax, sigmoid, tanh")
    if kind not in _QAT_PASS + _QAT_OUTPUT:
        where = (" (a BatchNormalization folds only right after a Conv/Dense layer that it alone reads, "
                 "with activation=None)" if kind == "BatchNormalization" else "")
        raise UnsupportedLayerError(
            f"qat: layer {layer.name!r} ({kind}) is not supported by the Keras 3 QAT route{where}. It takes "
            f"{', '.join(WEIGHTED)} (a BatchNormalization after one folded in), {', '.join(_QAT_OUTPUT)} and "
            f"{', '.join(_QAT_PASS)}. For other layers use tf_keras with tfmot, or convert with "
            "quantization='int8' after plain training")


def _check_qat_activation(layer: Any, kind: str) -> None:
    activation = activation_name(layer)
    if activation not in _FUSED + FIXED_RANGE:
        raise UnsupportedLayerError(
            f"qat: layer {layer.name!r} ({kind}) has activation {activation!r}; int8 QAT here takes "
            f"{', '.join(_FUSED + FIXED_RANGE)} (or put the activation in a layer of its own)")


class _QatRewrite:
    """The rebuild's ``call`` for QAT: each layer of ``model`` as it is called again in the quantized model."""

    def __init__(self, model: Any, nodes: list[tuple[Any, Any, list[str]]], decay: float) -> None:
        self.model, self.decay, self.keras, self.classes = model, decay, keras3(), _layer_classes()
        self.readers: dict[str, list[Any]] = {}
        for layer, _, sources in nodes:
            for source in sources:
                self.readers.setdefault(source, []).append(layer)
        self.input_names = {producing_layer_name(t) for t in model.inputs}
        self.output_names = {producing_layer_name(t) for t in model.outputs}
        self.folded = _foldable(nodes, self.only_reader)  # BatchNormalization name -> the layer it folds into
        self.pairs: list[tuple[Any, Any]] = []  # (new layer, original) whose weights are copied
        self.quantized_inputs: dict[int, Any] = {}

    def only_reader(self, layer: Any) -> Any:
        found = self.readers.get(layer.name, [])
        return found[0] if len(found) == 1 and layer.name not in self.output_names else None

    def activation_follows(self, layer: Any) -> bool:
        after = self.only_reader(layer)
        if after is not None and after.name in self.folded:
            after = self.only_reader(after)
        return after is not None and (kind_of(after) == "ReLU" or (kind_of(after) == "Activation"
                                                                 and activation_name(after) in ("relu", "relu6")))

    def quantize_inputs(self, inputs: Any) -> Any:
        """The model's inputs are quantized once, where first read."""
        for t in self.keras.tree.flatten(inputs):
            if producing_layer_name(t) in self.input_names and id(t) not in self.quantized_inputs:
                self.quantized_inputs[id(t)] = self.classes["FakeQuant"](
                    self.decay, name=f"quant_{producing_layer_name(t)}")(t)
        return self.keras.tree.map_structure(lambda t: self.quantized_inputs.get(id(t), t), inputs)

    def weighted(self, layer: Any, inputs: Any) -> Any:
        check_channels_last(layer, "qat")
        _check_qat_activation(layer, kind_of(layer))
        bn_name = next((name for name, source in self.folded.items() if source is layer), None)
        bn = _copy_layer(self.model.get_layer(bn_name)) if bn_name else None
        new = self.classes["QuantizeWeights"](_copy_layer(layer), batch_norm=bn, decay=self.decay,
                                              quantize_output=not self.activation_follows(layer),
                                              name=f"quant_{layer.name}")
        out = new(inputs)
        self.pairs.append((new.layer, layer))
        if bn is not None:
            self.pairs.append((bn, self.model.get_layer(bn_name)))
        return out

    def __call__(self, layer: Any, inputs: Any) -> Any:
        kind = kind_of(layer)
        inputs = self.quantize_inputs(inputs)
        if layer.name in self.folded:
            return inputs   # folded into the layer before it
        if kind in WEIGHTED:
            return self.weighted(layer, inputs)
        _check_qat_layer(layer, kind)
        new = _copy_layer(layer)
        out = new(inputs)
        self.pairs.append((new, layer))
        fixed = kind == "Softmax" or (kind == "Activation" and activation_name(layer) in FIXED_RANGE)
        if kind in _QAT_OUTPUT and not fixed:
            out = self.classes["FakeQuant"](self.decay, name=f"quant_{layer.name}")(out)
        return out


def apply_qat(model: Any, *, decay: float = 0.999) -> Any:
    """``model`` (Keras 3) ready for quantization-aware training: inputs and outputs fake-quantized, weighted layers
    wrapped by ``QuantizeWeights`` with a following BatchNormalization folded in.

    Raises:
        UnsupportedLayerError: a layer outside what int8 QAT here takes (the message lists them).
    """
    number("decay", decay, above=0, below=1)
    rewrite = _QatRewrite(model, _graph(model, "qat"), decay)
    return _rebuild(model, "qat", rewrite, lambda: _copy_weights(rewrite.pairs))
