"""Tensor (intra-layer) model parallelism after Megatron-LM.

Shoeybi, Patwary, Puri, LeGresley, Casper and Catanzaro, "Megatron-LM: Training
Multi-Billion Parameter Language Models Using Model Parallelism", 2019 (arXiv:1909.08053).

A column-parallel dense layer splits its kernel ``W = [W_1 ... W_N]`` along the output
axis: device ``i`` computes ``act(x W_i + b_i)``, one slice of the output, with no
communication. A row-parallel dense layer splits its kernel along the input axis: device
``i`` multiplies its input slice ``x_i`` by ``W_i`` and the partial products are summed (the
all-reduce, here a reduction onto the first device), after which the bias is added once.
The Megatron MLP is a column-parallel layer feeding a row-parallel one (one reduction per
forward pass); Megatron attention gives each device ``heads / N`` whole heads (query, key and
value projections column-parallel, the output projection row-parallel).

Each shard's variables are created on its device with ``tf.device`` and its computation runs
there, so on logical CPU devices these layers split the work exactly as they would over
accelerators. Every layer can be made from its unsplit Keras counterpart (``from_dense``,
``from_keras``) so that the two compute the same function from the same weights.

Example:
    >>> import tensorflow as tf, tf_keras  # these layers are made from Keras 2 (tf_keras) layers
    >>> from tensorfleet.model_parallel import tensor_parallel as tp
    >>> dense1 = tf_keras.layers.Dense(8, activation="relu"); dense2 = tf_keras.layers.Dense(4)
    >>> x = tf.ones((2, 6)); reference = dense2(dense1(x))
    >>> mlp = tp.ParallelMLP.from_dense(dense1, dense2, devices=["/CPU:0", "/CPU:1"])
    >>> float(tf.reduce_max(tf.abs(mlp(x) - reference))) < 1e-6
    True
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Iterator, Sequence

import tensorflow as tf

from tensorfleet.compat.keras import keras2, require_keras2_layer
from tensorfleet.compat.tf_keras import attention_parts
from tensorfleet.validation import positive_int

__all__ = ["ColumnParallelDense", "RowParallelDense", "ParallelMLP", "ParallelSelfAttention",
           "ParallelTransformerBlock", "check_devices", "compute_on", "split_evenly"]

# tf_keras (tf.keras before TF 2.16), whose Layer the layers here subclass: a module mypy does not follow.
_keras2: Any = keras2()

_PLACEMENT = threading.local()


@contextlib.contextmanager
def compute_on(devices: Sequence[str]) -> Iterator[None]:
    """Runs the shards' computation on ``devices`` instead of the devices holding their weights.

    A data-parallel replica of a tensor-parallel model uses this to compute on its own row of
    a (data x model) device mesh while reading the one sharded copy of the weights.
    """
    previous = getattr(_PLACEMENT, "devices", None)
    _PLACEMENT.devices = check_devices(devices)
    try:
        yield
    finally:
        _PLACEMENT.devices = previous


def _compute_devices(devices: list[str]) -> list[str]:
    override = getattr(_PLACEMENT, "devices", None)
    return override if override is not None and len(override) == len(devices) else devices


def check_devices(devices: Sequence[str]) -> list[str]:
    """Validates a list of device names (at least one, each a non-empty string)."""
    if isinstance(devices, str) or not isinstance(devices, Sequence) or len(devices) == 0:
        raise ValueError(
            "devices must be a non-empty list of device names such as ['/CPU:0', '/CPU:1']. "
            f"Received: devices={devices!r}"
        )
    for device in devices:
        if not isinstance(device, str) or not device:
            raise ValueError(f"Each device must be a non-empty string. Received: devices={list(devices)!r}")
    return list(devices)


def split_evenly(size: int, parts: int, *, what: str) -> int:
    """Returns ``size // parts``; raises a clear error when ``parts`` does not divide ``size``."""
    if size % parts != 0:
        raise ValueError(
            f"{what}={size} cannot be split evenly over {parts} devices; use a number of devices "
            f"that divides {size}. Received: {what}={size}, devices={parts}"
        )
    return size // parts


def _sum_on(tensors: list[tf.Tensor], device: str) -> tf.Tensor:
    # The all-reduce of Megatron: partial products meet on one device and are summed there.
    with tf.device(device):
        return tf.add_n([tf.identity(t) for t in tensors]) if len(tensors) > 1 else tf.identity(tensors[0])


class ColumnParallelDense(_keras2.layers.Layer):
    """A dense layer whose kernel is split along its output axis over ``devices``.

    Args:
        units: output width of the unsplit layer; must be divisible by ``len(devices)``.
        devices: one device name per shard.
        activation: applied shard-wise (element-wise activations only).
        use_bias: whether each shard has its slice of the bias.
        kernel_initializer: initializer of each kernel shard.
        gather_output: if True, the shards are concatenated on the first device and one
            tensor is returned; otherwise a list of ``len(devices)`` output slices.

    Example:
        >>> layer = ColumnParallelDense(8, devices=["/CPU:0", "/CPU:1"], gather_output=True)
        >>> layer(tf.ones((3, 5))).shape
        TensorShape([3, 8])
    """

    def __init__(self, units: int, *, devices: Sequence[str], activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", gather_output: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units = positive_int("units", units)
        self.devices = check_devices(devices)
        self.shard_units = split_evenly(units, len(self.devices), what="units")
        self.activation = keras2().activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras2().initializers.get(kernel_initializer)
        self.gather_output = gather_output

    def build(self, input_shape: Any) -> None:
        in_dim = int(tf.TensorShape(input_shape)[-1])
        self.kernels, self.biases = [], []
        parts = _initial_parts(self.kernel_initializer, (in_dim, self.units), len(self.devices), axis=1)
        for i, device in enumerate(self.devices):
            with tf.device(device):
                self.kernels.append(self.add_weight(f"kernel_{i}", shape=(in_dim, self.shard_units),
                                                    initializer=keras2().initializers.Constant(parts[i])))
                if self.use_bias:
                    self.biases.append(self.add_weight(f"bias_{i}", shape=(self.shard_units,), initializer="zeros"))
        super().build(input_shape)

    def call(self, inputs: tf.Tensor) -> Any:
        outputs = []
        devices = _compute_devices(self.devices)
        for i, device in enumerate(devices):
            with tf.device(device):
                y = tf.matmul(tf.identity(inputs), self.kernels[i]) if inputs.shape.rank == 2 else \
                    tf.tensordot(tf.identity(inputs), self.kernels[i], axes=1)
                if self.use_bias:
                    y = y + self.biases[i]
                outputs.append(self.activation(y))
        if self.gather_output:
            with tf.device(devices[0]):
                return tf.concat(outputs, axis=-1)
        return outputs

    @classmethod
    def from_dense(cls, dense: _keras2.layers.Dense, *, devices: Sequence[str], gather_output: bool = False,
                   **kwargs: Any) -> "ColumnParallelDense":
        """A column-parallel copy of a built ``Dense`` layer (same weights, same function)."""
        require_keras2_layer(dense, "ColumnParallelDense.from_dense")
        _require_built(dense)
        layer = cls(dense.units, devices=devices, activation=dense.activation, use_bias=dense.use_bias,
                    gather_output=gather_output, **kwargs)
        kernel = dense.kernel.numpy()
        layer.build((None, kernel.shape[0]))
        n = len(layer.devices)
        for i, part in enumerate(_split(kernel, n, axis=1)):
            layer.kernels[i].assign(part)
        if dense.use_bias:
            for i, part in enumerate(_split(dense.bias.numpy(), n, axis=0)):
                layer.biases[i].assign(part)
        return layer


class RowParallelDense(_keras2.layers.Layer):
    """A dense layer whose kernel is split along its input axis over ``devices``.

    Takes either the list of input slices a :class:`ColumnParallelDense` returns, or one
    tensor, which it slices itself. Partial products are summed on the first device, then the
    (unsplit) bias and the activation are applied there.

    Args:
        units: output width.
        devices: one device name per shard.
        activation: applied after the reduction.
        use_bias: whether to add a bias after the reduction.
        kernel_initializer: initializer of each kernel shard.

    Example:
        >>> layer = RowParallelDense(3, devices=["/CPU:0", "/CPU:1"])
        >>> layer(tf.ones((2, 8))).shape
        TensorShape([2, 3])
    """

    def __init__(self, units: int, *, devices: Sequence[str], activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units = positive_int("units", units)
        self.devices = check_devices(devices)
        self.activation = keras2().activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras2().initializers.get(kernel_initializer)

    def build(self, input_shape: Any) -> None:
        n = len(self.devices)
        if (isinstance(input_shape, (list, tuple)) and input_shape
                and isinstance(input_shape[0], (list, tuple, tf.TensorShape))):
            in_dim = sum(int(tf.TensorShape(s)[-1]) for s in input_shape)
        else:
            in_dim = int(tf.TensorShape(input_shape)[-1])
        self.shard_in = split_evenly(in_dim, n, what="input features")
        self.kernels = []
        parts = _initial_parts(self.kernel_initializer, (in_dim, self.units), n, axis=0)
        for i, device in enumerate(self.devices):
            with tf.device(device):
                self.kernels.append(self.add_weight(f"kernel_{i}", shape=(self.shard_in, self.units),
                                                    initializer=keras2().initializers.Constant(parts[i])))
        if self.use_bias:
            with tf.device(self.devices[0]):
                self.bias = self.add_weight("bias", shape=(self.units,), initializer="zeros")
        super().build(input_shape)

    def call(self, inputs: Any) -> tf.Tensor:
        n = len(self.devices)
        if isinstance(inputs, (list, tuple)):
            if len(inputs) != n:
                raise ValueError(f"RowParallelDense over {n} devices needs {n} input slices. "
                                 f"Received: {len(inputs)} slices")
            slices = list(inputs)
        else:
            slices = tf.split(inputs, n, axis=-1)
        partials = []
        devices = _compute_devices(self.devices)
        for i, device in enumerate(devices):
            with tf.device(device):
                x = tf.identity(slices[i])
                partials.append(tf.matmul(x, self.kernels[i]) if x.shape.rank == 2
                                else tf.tensordot(x, self.kernels[i], axes=1))
        y = _sum_on(partials, devices[0])
        with tf.device(devices[0]):
            if self.use_bias:
                y = y + self.bias
            return self.activation(y)

    @classmethod
    def from_dense(cls, dense: _keras2.layers.Dense, *, devices: Sequence[str], **kwargs: Any) -> "RowParallelDense":
        """A row-parallel copy of a built ``Dense`` layer (same weights, same function)."""
        require_keras2_layer(dense, "RowParallelDense.from_dense")
        _require_built(dense)
        layer = cls(dense.units, devices=devices, activation=dense.activation, use_bias=dense.use_bias, **kwargs)
        kernel = dense.kernel.numpy()
        layer.build((None, kernel.shape[0]))
        for i, part in enumerate(_split(kernel, len(layer.devices), axis=0)):
            layer.kernels[i].assign(part)
        if dense.use_bias:
            layer.bias.assign(dense.bias.numpy())
        return layer


class ParallelMLP(_keras2.layers.Layer):
    """Megatron's MLP: column-parallel ``Dense(hidden, activation)`` then row-parallel ``Dense(units)``.

    One reduction per forward pass; the hidden activations never leave their devices.

    Example:
        >>> mlp = ParallelMLP(16, 4, devices=["/CPU:0", "/CPU:1"])
        >>> mlp(tf.ones((2, 6))).shape
        TensorShape([2, 4])
    """

    def __init__(self, hidden_units: int, units: int, *, devices: Sequence[str], activation: Any = "relu",
                 use_bias: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.devices = check_devices(devices)
        self.column = ColumnParallelDense(hidden_units, devices=self.devices, activation=activation,
                                          use_bias=use_bias, name="column")
        self.row = RowParallelDense(units, devices=self.devices, use_bias=use_bias, name="row")

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        return self.row(self.column(inputs))

    @classmethod
    def from_dense(cls, first: _keras2.layers.Dense, second: _keras2.layers.Dense, *,
                   devices: Sequence[str], **kwargs: Any) -> "ParallelMLP":
        """The split copy of ``second(first(x))``; ``second`` must have no activation of its own
        beyond what a row-parallel layer applies after its reduction."""
        for layer in (first, second):
            require_keras2_layer(layer, "ParallelMLP.from_dense")
        mlp = cls(first.units, second.units, devices=devices, activation=first.activation,
                  use_bias=first.use_bias, **kwargs)
        mlp.column = ColumnParallelDense.from_dense(first, devices=mlp.devices, name="column")
        mlp.row = RowParallelDense.from_dense(second, devices=mlp.devices, name="row")
        mlp.built = True
        return mlp


class ParallelSelfAttention(_keras2.layers.Layer):
    """Megatron's self-attention: ``num_heads / N`` whole heads on each of the N devices.

    Computes what ``tf.keras.layers.MultiHeadAttention(num_heads, key_dim)(x, x)`` computes
    (no mask, no dropout): each device projects its heads' queries, keys and values
    (column-parallel), attends, and multiplies by its rows of the output projection; the
    partial outputs are summed on the first device, where the output bias is added.

    Example:
        >>> attention = ParallelSelfAttention(4, 8, devices=["/CPU:0", "/CPU:1"])
        >>> attention(tf.ones((2, 5, 16))).shape
        TensorShape([2, 5, 16])
    """

    def __init__(self, num_heads: int, key_dim: int, *, devices: Sequence[str], output_dim: int | None = None,
                 use_bias: bool = True, kernel_initializer: Any = "glorot_uniform", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_heads = positive_int("num_heads", num_heads)
        self.key_dim = positive_int("key_dim", key_dim)
        self.devices = check_devices(devices)
        self.shard_heads = split_evenly(num_heads, len(self.devices), what="num_heads")
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.kernel_initializer = keras2().initializers.get(kernel_initializer)

    def build(self, input_shape: Any) -> None:
        model_dim = int(tf.TensorShape(input_shape)[-1])
        out_dim = self.output_dim or model_dim
        h, k = self.shard_heads, self.key_dim
        self.shards: list[dict[str, tf.Variable]] = []
        n = len(self.devices)
        full = (model_dim, self.num_heads, k)
        parts = {name: _initial_parts(self.kernel_initializer, full, n, axis=1) for name in ("query", "key", "value")}
        parts["output"] = _initial_parts(self.kernel_initializer, (self.num_heads, k, out_dim), n, axis=0)
        for i, device in enumerate(self.devices):
            shard = {}
            with tf.device(device):
                for name in ("query", "key", "value"):
                    shard[f"{name}_kernel"] = self.add_weight(f"{name}_kernel_{i}", shape=(model_dim, h, k),
                                                              initializer=keras2().initializers.Constant(parts[name][i]))
                    if self.use_bias:
                        shard[f"{name}_bias"] = self.add_weight(f"{name}_bias_{i}", shape=(h, k), initializer="zeros")
                shard["output_kernel"] = self.add_weight(f"output_kernel_{i}", shape=(h, k, out_dim),
                                                         initializer=keras2().initializers.Constant(parts["output"][i]))
            self.shards.append(shard)
        if self.use_bias:
            with tf.device(self.devices[0]):
                self.output_bias = self.add_weight("output_bias", shape=(out_dim,), initializer="zeros")
        super().build(input_shape)

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        partials = []
        devices = _compute_devices(self.devices)
        for shard, device in zip(self.shards, devices):
            with tf.device(device):
                x = tf.identity(inputs)
                q, k, v = (tf.einsum("bsd,dhk->bshk", x, shard[f"{n}_kernel"]) for n in ("query", "key", "value"))
                if self.use_bias:
                    q, k, v = q + shard["query_bias"], k + shard["key_bias"], v + shard["value_bias"]
                q = q * (1.0 / math.sqrt(float(self.key_dim)))
                scores = tf.nn.softmax(tf.einsum("btnh,bsnh->bnst", k, q), axis=-1)
                context = tf.einsum("bnst,btnh->bsnh", scores, v)
                partials.append(tf.einsum("bsnh,nhd->bsd", context, shard["output_kernel"]))
        y = _sum_on(partials, devices[0])
        if self.use_bias:
            with tf.device(devices[0]):
                y = y + self.output_bias
        return y

    @classmethod
    def from_keras(cls, attention: _keras2.layers.MultiHeadAttention, *, devices: Sequence[str],
                   **kwargs: Any) -> "ParallelSelfAttention":
        """A head-split copy of a built ``MultiHeadAttention`` used as self-attention."""
        require_keras2_layer(attention, "ParallelSelfAttention.from_keras")
        _require_built(attention)
        parts = attention_parts(attention)
        query_kernel = parts.query.kernel.numpy()
        use_bias = parts.use_bias
        layer = cls(parts.num_heads, parts.key_dim, devices=devices,
                    output_dim=parts.output.kernel.shape[-1], use_bias=use_bias, **kwargs)
        layer.build((None, None, query_kernel.shape[0]))
        n = len(layer.devices)
        for name, dense in parts.projections.items():
            for i, part in enumerate(_split(dense.kernel.numpy(), n, axis=1)):
                layer.shards[i][f"{name}_kernel"].assign(part)
            if use_bias:
                for i, part in enumerate(_split(dense.bias.numpy(), n, axis=0)):
                    layer.shards[i][f"{name}_bias"].assign(part)
        for i, part in enumerate(_split(parts.output.kernel.numpy(), n, axis=0)):
            layer.shards[i]["output_kernel"].assign(part)
        if use_bias:
            layer.output_bias.assign(parts.output.bias.numpy())
        return layer


class ParallelTransformerBlock(_keras2.layers.Layer):
    """A tensor-parallel transformer block: Megatron attention and MLP with residuals.

    ``x + attention(x)`` then ``h + mlp(h)``: the function of
    :class:`tensorfleet.models.transformer.TransformerBlock`, with heads and MLP hidden units
    split over ``devices`` (two reductions per forward pass, as in Megatron).
    """

    def __init__(self, attention: ParallelSelfAttention, mlp: ParallelMLP, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.attention = attention
        self.mlp = mlp
        self.devices = attention.devices

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        with tf.device(_compute_devices(self.devices)[0]):
            h = inputs + self.attention(inputs)
            return h + self.mlp(h)

    @classmethod
    def from_block(cls, block: Any, *, devices: Sequence[str], heads_devices: Sequence[str] | None = None,
                   **kwargs: Any) -> "ParallelTransformerBlock":
        """Splits a built :class:`~tensorfleet.models.transformer.TransformerBlock`.

        Args:
            block: the unsplit block.
            devices: devices for the MLP's hidden units.
            heads_devices: devices for the attention heads (default: ``devices``).
        """
        require_keras2_layer(block, "ParallelTransformerBlock.from_block")
        attention = ParallelSelfAttention.from_keras(block.attention, devices=heads_devices or devices)
        mlp = ParallelMLP.from_dense(block.dense1, block.dense2, devices=devices)
        return cls(attention, mlp, **kwargs)


def _split(array: Any, parts: int, *, axis: int) -> list[Any]:
    import numpy as np

    split_evenly(array.shape[axis], parts, what=f"axis {axis} of a weight of shape {tuple(array.shape)}")
    return np.split(array, parts, axis=axis)


def _initial_parts(initializer: Any, shape: tuple[int, ...], parts: int, *, axis: int) -> list[Any]:
    # Draw the unsplit weight once and cut it: shards are not copies of one draw, and start as an unsplit layer's would.
    import copy

    full = copy.deepcopy(initializer)(shape, dtype=tf.float32).numpy()
    return _split(full, parts, axis=axis)


def _require_built(layer: _keras2.layers.Layer) -> None:
    if not layer.built:
        raise ValueError(f"Layer {layer.name!r} must be built (called once) before it can be split.")
