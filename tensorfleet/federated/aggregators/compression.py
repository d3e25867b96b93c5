"""Update compression: top-k sparsification and uniform quantization, in TensorFlow.

Each client's update is sparsified (keep the ``1 - sparsity`` fraction of largest magnitudes per
tensor) and then quantized to ``bits`` per value over the tensor's ``[min, max]``
(:meth:`Compression.compress`) before the server sums the (dequantized) values: in the compiled
backend's round, or, on the ``tff`` backend, inside TFF through :class:`CompressionFactory` (a TFF
aggregation factory, made when first asked for: it needs tensorflow-federated). The rules are
:func:`tensorfleet.federated.aggregators.aggregate.sparsify` and :func:`~tensorfleet.federated.aggregators.aggregate.quantize`
(quantization after Konečný et al., "Federated Learning: Strategies for Improving Communication
Efficiency", 2016; top-k after Aji and Heafield, "Sparse Communication for Distributed Gradient
Descent", EMNLP 2017). What one client would upload is counted by
:func:`~tensorfleet.federated.aggregators.aggregate.compressed_bytes`.

Example:
    >>> import numpy as np
    >>> Compression(bits=32, sparsity=0.5).compress(np.array([0.1, -3.0, 2.0, 0.2], np.float32)).numpy()
    array([ 0., -3.,  2.,  0.], dtype=float32)

On the tff track, the weighted mean of compressed updates for FedAvg:
    >>> import tensorflow_federated as tff
    >>> factory = compression_factory(bits=8, sparsity=0.9)
    >>> isinstance(factory, tff.aggregators.MeanFactory)
    True
"""

from __future__ import annotations

from typing import Any

import functools

import tensorflow as tf

from tensorfleet.federated.aggregators.aggregate import kept_count
from tensorfleet.validation import integer, number

__all__ = ["Compression", "compression_factory", "tf_quantize", "tf_sparsify"]  # and CompressionFactory, made on use


def tf_quantize(t: tf.Tensor, bits: int) -> tf.Tensor:
    """TensorFlow twin of :func:`tensorfleet.federated.aggregators.aggregate.quantize`."""
    lo = tf.reduce_min(t)
    hi = tf.reduce_max(t)
    levels = float(2 ** bits - 1)
    scale = (hi - lo) / levels
    safe = tf.where(scale > 0, scale, tf.ones_like(scale))
    return tf.where(scale > 0, lo + tf.round((t - lo) / safe) * safe, t)


def tf_sparsify(t: tf.Tensor, sparsity: float) -> tf.Tensor:
    """TensorFlow twin of :func:`tensorfleet.federated.aggregators.aggregate.sparsify`."""
    flat = tf.reshape(t, [-1])
    k = kept_count(int(flat.shape[0]), sparsity)
    keep = tf.argsort(-tf.abs(flat), stable=True)[:k]
    out = tf.scatter_nd(keep[:, None], tf.gather(flat, keep), tf.shape(flat))
    return tf.reshape(out, tf.shape(t))


class Compression:
    """How a client compresses each tensor of its update.

    Args:
        bits: bits per value (1 to 32; 32 leaves values unquantized).
        sparsity: fraction of each tensor's values zeroed (0 keeps all), in [0, 1).
    """

    def __init__(self, *, bits: int = 8, sparsity: float = 0.0) -> None:
        self.bits = integer("bits", bits, minimum=1, maximum=32)
        self.sparsity = number("sparsity", sparsity, minimum=0, below=1)

    def compress(self, t: tf.Tensor) -> tf.Tensor:
        """One tensor as a client sends it: sparsified, then quantized (TensorFlow)."""
        if self.sparsity > 0:
            t = tf_sparsify(t, self.sparsity)
        if self.bits < 32:
            t = tf_quantize(t, self.bits)
        return t


@functools.lru_cache(maxsize=None)
def _factory_class() -> type:
    """:class:`CompressionFactory`, made on first use: its base class is TFF's."""
    from tensorfleet.compat.tff import import_tff

    tff = import_tff("CompressionFactory (the compression aggregator of the tff backend)")

    class CompressionFactory(Compression, tff.aggregators.UnweightedAggregationFactory):
        """Unweighted sum of compressed client values (TFF); takes the arguments of :class:`Compression`."""

        def create(self, value_type: Any) -> Any:
            value_type = tff.to_type(value_type)
            inner = tff.aggregators.SumFactory().create(value_type)

            @tff.tensorflow.computation(value_type)
            def compress(value: Any) -> Any:
                return tf.nest.map_structure(self.compress, value)

            @tff.federated_computation()
            def init_fn() -> Any:
                return inner.initialize()

            @tff.federated_computation(init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS))
            def next_fn(state: Any, value: Any) -> Any:
                return inner.next(state, tff.federated_map(compress, value))

            return tff.templates.AggregationProcess(init_fn, next_fn)

    CompressionFactory.__module__ = __name__
    return CompressionFactory


def compression_factory(*, bits: int = 8, sparsity: float = 0.0) -> Any:
    """A weighted mean of compressed updates (``tff.aggregators.MeanFactory`` over the compressed sum; TFF)."""
    from tensorfleet.compat.tff import import_tff

    tff = import_tff("the compression aggregator's TFF factory")
    return tff.aggregators.MeanFactory(value_sum_factory=_factory_class()(bits=bits, sparsity=sparsity))


def __getattr__(name: str) -> Any:
    if name == "CompressionFactory":  # made on first use: it needs tensorflow-federated
        return _factory_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
