"""Update compression: top-k sparsification and uniform quantization, in TensorFlow.

Each client's update is sparsified (keep the ``1 - sparsity`` fraction of largest magnitudes per
tensor) and then quantized to ``bits`` per value over the tensor's ``[min, max]``
(:func:`compress_rows`, written once: :meth:`Compression.compress` is one row of it) before the
server sums the (dequantized) values: in the compiled backend's round, or, on the ``tff`` backend, inside TFF through
:class:`CompressionFactory` (a TFF aggregation factory, made when first asked for: it needs tensorflow-federated). The
rules are :func:`tensorfleet.federated.aggregators.aggregate.sparsify` and
:func:`~tensorfleet.federated.aggregators.aggregate.quantize` (quantization after Konečný et al., "Federated Learning:
Strategies for Improving Communication Efficiency", 2016; top-k after Aji and Heafield, "Sparse Communication for
Distributed Gradient Descent", EMNLP 2017). What one client would upload is counted by
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

import functools
from typing import Any

import tensorflow as tf

from tensorfleet.federated.aggregators.aggregate import kept_count
from tensorfleet.validation import integer, number

__all__ = ["Compression", "compress_rows", "compression_factory"]  # and CompressionFactory, made on use


def compress_rows(rows: Any, *, bits: int, sparsity: float) -> Any:
    """Every row of ``rows`` (``[count, n]``) as a client sends that tensor under the ``compression``
    aggregator (the kept values, then quantized over the row's own ``[min, max]``): the numpy rules
    :func:`~tensorfleet.federated.aggregators.aggregate.sparsify` then
    :func:`~tensorfleet.federated.aggregators.aggregate.quantize`, for every row at once.

    The kept values are those the reference's stable argsort keeps (ties at the lowest index):
    for rows of up to 2,048 values by an unsorted ``top_k`` (which breaks ties the same way); for
    longer ones by a radix select, as ``top_k`` costs about 1.7 ms for 32,768 values against 0.8:
    the bits of each row's ``k``-th largest magnitude (magnitudes order as their int32 bits) from
    three per-row histograms of 10, 11 and 10 bits, then every larger value and the first ties up
    to ``k``.
    """
    n = int(rows.shape[1])
    if sparsity > 0:
        k = kept_count(n, sparsity)
        if n <= 2048:
            keep = tf.math.top_k(tf.abs(rows), k, sorted=False).indices
            mask = tf.cast(tf.math.bincount(keep, minlength=n, maxlength=n, axis=-1), tf.bool)
        else:
            mask = _top_mask(tf.bitcast(tf.abs(rows), tf.int32), k)
        rows = tf.where(mask, rows, tf.zeros_like(rows))
    if bits >= 32:
        return rows
    lo = tf.reduce_min(rows, axis=1, keepdims=True)
    scale = (tf.reduce_max(rows, axis=1, keepdims=True) - lo) / float(2 ** bits - 1)
    safe = tf.where(scale > 0, scale, tf.ones_like(scale))
    # aggregate.quantize's arithmetic, per row
    return tf.where(scale > 0, lo + tf.round((rows - lo) / safe) * safe, rows)


def _top_mask(bits: Any, k: int) -> Any:
    """Which of each row's non-negative int32 ``bits`` the stable descending argsort puts in its first
    ``k`` (in a row whose ``k``-th largest is 0, every 0 as well: its values are the same)."""
    right = tf.bitwise.right_shift
    count = tf.shape(bits)[:1]
    prefix = tf.zeros(tf.concat([count, [1]], 0), tf.int32)  # the k-th largest's bits found so far
    need = tf.fill(tf.concat([count, [1]], 0), k)  # how many of the values matching the prefix to keep
    for shift, width in ((21, 10), (10, 11), (0, 10)):  # bits 30..0 (the sign bit of a magnitude is 0)
        digit = right(bits, shift)
        if shift < 21:  # values off the prefix go to bin 2 ** width, dropped
            digit = tf.where(tf.equal(right(bits, shift + width), right(prefix, shift + width)),
                             tf.bitwise.bitwise_and(digit, 2 ** width - 1), 2 ** width)
        at_least = tf.math.cumsum(tf.math.bincount(digit, minlength=2 ** width + 1, maxlength=2 ** width + 1,
                                                   axis=-1)[:, :2 ** width], axis=1, reverse=True)
        d = tf.reduce_sum(tf.cast(at_least >= need, tf.int32), axis=1, keepdims=True) - 1
        need -= tf.gather(tf.pad(at_least[:, 1:], [[0, 0], [0, 1]]), d, batch_dims=1)
        prefix += tf.bitwise.left_shift(d, shift)
    tie = tf.equal(bits, prefix)
    # Where the k-th magnitude is 0, keeping every zero keeps the same values (zeros either way).
    exact = tf.equal(tf.reduce_sum(tf.cast(tie, tf.int32), axis=1, keepdims=True), need) | tf.equal(prefix, 0)
    return tf.cond(tf.reduce_all(exact), lambda: bits >= prefix, lambda: (bits > prefix) | _first_ties(tie, need))


def _first_ties(tie: Any, need: Any) -> Any:
    """The first ``need`` (``[rows, 1]``) of each row's ``tie`` positions. In updates a row rarely
    needs more than a few (equal magnitudes at the k-th value): then from a ``top_k`` of the
    smallest positions, as a running count over every value costs about as much as the three
    histograms; else from that running count."""
    most = tf.reduce_max(need)

    def few() -> Any:
        columns = tf.range(tf.shape(tie)[1])[None, :]
        firsts = -tf.math.top_k(-tf.where(tie, columns, tf.shape(tie)[1]), tf.maximum(most, 1)).values
        last = tf.gather(firsts, tf.maximum(need - 1, 0), batch_dims=1)  # the need-th tie's position
        return tie & (columns <= last) & (need > 0)

    return tf.cond(most <= 64, few, lambda: tie & (tf.math.cumsum(tf.cast(tie, tf.int32), axis=1) <= need))


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
        t = tf.convert_to_tensor(t)
        row = compress_rows(tf.reshape(t, [1, -1]), bits=self.bits, sparsity=self.sparsity)
        return tf.reshape(row, tf.shape(t))


@functools.lru_cache(maxsize=None)
def _factory_class() -> type:
    """:class:`CompressionFactory`, made on first use: its base class is TFF's."""
    from tensorfleet.compat.tff import import_tff

    tff: Any = import_tff("CompressionFactory (the compression aggregator of the tff backend)")  # a base class

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
