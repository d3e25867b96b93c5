"""Robust aggregation: coordinate-wise median, trimmed mean, Krum, in TensorFlow.

:class:`RobustStatistic` applies a rule to the clients' flattened updates stacked ``[clients, d]``;
the compiled backend calls it inside its round. TFF ships clipping and zeroing but no robust
statistic, so for the ``tff`` backend :class:`RobustFactory` (a TFF aggregation factory, made when
first asked for: it needs tensorflow-federated) collects the clients' flattened updates at the
server with ``tff.federated_aggregate`` (concatenation as the accumulator) and applies the same
statistic inside TFF's worker. The rules and their papers are in
:mod:`tensorfleet.federated.aggregators.aggregate`, whose numpy functions the tests compare these
against.

The rules are unweighted (a robust statistic cannot trust client-reported weights), so
algorithms use TFF's unweighted variants with them.

Example (five clients, one of them sending a huge update; the trimmed mean ignores it):
    >>> import numpy as np
    >>> updates = np.array([[1, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4], [100, -100, 100]], np.float32)
    >>> RobustStatistic("trimmed_mean", beta=0.2).statistic(updates).numpy()
    array([3., 2., 3.], dtype=float32)

On the tff track, the same rule as a TFF factory, run on a worker this process owns:
    >>> import tensorflow_federated as tff
    >>> from tensorfleet.federated.aggregators.robust import RobustFactory
    >>> from tensorfleet.federated.backends.tff import managed_context
    >>> process = RobustFactory("trimmed_mean", beta=0.2).create(tff.to_type((np.float32, (3,))))
    >>> with managed_context():
    ...     out = process.next(process.initialize(), list(updates))
    >>> out.result
    array([3., 2., 3.], dtype=float32)
    >>> dict(out.measurements)
    {'clients': 5, 'non_finite': 0}
"""

from __future__ import annotations

import collections
import functools
from enum import Enum
from typing import Any

import numpy as np
import tensorflow as tf

from tensorfleet.validation import choice, integer, number, positive_int

__all__ = ["RobustRule", "RobustStatistic", "tf_median", "tf_trimmed_mean", "tf_krum"]  # and RobustFactory, made on use


class RobustRule(str, Enum):
    MEDIAN = "median"
    TRIMMED_MEAN = "trimmed_mean"
    KRUM = "krum"


def _finite(u: tf.Tensor) -> tf.Tensor:
    return tf.boolean_mask(u, tf.reduce_all(tf.math.is_finite(u), axis=1))


def _median_sorted(s: tf.Tensor) -> tf.Tensor:
    n = tf.shape(s)[0]
    upper = s[n // 2]
    lower = s[(n - 1) // 2]
    return (upper + lower) / 2.0


def tf_median(u: tf.Tensor) -> tf.Tensor:
    """TensorFlow twin of :func:`tensorfleet.federated.aggregators.aggregate.coordinate_median`."""
    u = _finite(u)
    d = tf.shape(u)[1]
    return tf.cond(tf.shape(u)[0] > 0, lambda: _median_sorted(tf.sort(u, axis=0)), lambda: tf.zeros([d], u.dtype))


def tf_trimmed_mean(u: tf.Tensor, beta: float) -> tf.Tensor:
    """TensorFlow twin of :func:`tensorfleet.federated.aggregators.aggregate.trimmed_mean`."""
    u = _finite(u)
    n = tf.shape(u)[0]
    d = tf.shape(u)[1]
    k = tf.cast(tf.math.floor(beta * tf.cast(n, tf.float64)), tf.int32)

    def trimmed() -> tf.Tensor:
        s = tf.sort(u, axis=0)
        return tf.cond(n - 2 * k > 0, lambda: tf.reduce_mean(s[k:n - k], axis=0), lambda: _median_sorted(s))

    return tf.cond(n > 0, trimmed, lambda: tf.zeros([d], u.dtype))


def tf_krum(u: tf.Tensor, num_byzantine: int, num_selected: int) -> tf.Tensor:
    """TensorFlow twin of :func:`tensorfleet.federated.aggregators.aggregate.krum` (fails the
    computation with that function's message when ``n <= 2f + 2``)."""
    bound = 2 * num_byzantine + 2
    enough = tf.debugging.assert_greater(
        tf.shape(u)[0], bound, summarize=1,
        message=f"Krum needs more than 2 * num_byzantine + 2 clients (n > 2f + 2, Blanchard et al. 2017): "
                f"with num_byzantine={num_byzantine}, at least {bound + 1}. Received updates")
    with tf.control_dependencies([enough]):
        u = tf.identity(_finite(u))
    n = tf.shape(u)[0]
    d = tf.shape(u)[1]

    def select() -> tf.Tensor:
        sq_norms = tf.reduce_sum(tf.square(u), axis=1)
        diff = u[:, None, :] - u[None, :, :]
        sq = tf.reduce_sum(tf.square(diff), axis=-1)
        neighbours = tf.maximum(n - num_byzantine - 2, 1)
        ordered = tf.sort(sq, axis=1)
        scores = tf.cond(n > 1, lambda: tf.reduce_sum(ordered[:, 1:1 + neighbours], axis=1),
                         lambda: tf.zeros_like(sq_norms))
        chosen = tf.argsort(scores, stable=True)[: tf.minimum(num_selected, n)]
        return tf.reduce_mean(tf.gather(u, chosen), axis=0)

    return tf.cond(n > 0, select, lambda: tf.zeros([d], u.dtype))


class RobustStatistic:
    """A robust rule applied to client updates (TensorFlow), with its options checked.

    Args:
        rule: ``median``, ``trimmed_mean`` or ``krum``.
        beta: fraction trimmed from each end (``trimmed_mean``), in [0, 0.5).
        num_byzantine: clients assumed Byzantine (``krum``'s ``f``).
        num_selected: updates Multi-Krum averages (1: Krum).
    """

    def __init__(self, rule: str | RobustRule, *, beta: float = 0.1, num_byzantine: int = 1,
                 num_selected: int = 1) -> None:
        self.rule = choice(RobustRule, "rule", rule)
        self.beta = number("beta", beta, minimum=0, below=0.5)
        self.num_byzantine = integer("num_byzantine", num_byzantine, minimum=0)
        self.num_selected = positive_int("num_selected", num_selected)

    def statistic(self, u: tf.Tensor) -> tf.Tensor:
        """The rule applied to stacked flattened updates ``u`` ``[clients, d]`` (TensorFlow)."""
        if self.rule is RobustRule.MEDIAN:
            return tf_median(u)
        if self.rule is RobustRule.TRIMMED_MEAN:
            return tf_trimmed_mean(u, self.beta)
        return tf_krum(u, self.num_byzantine, self.num_selected)


@functools.lru_cache(maxsize=None)
def _float_leaves(tff: Any, value_type: Any) -> tuple[bool, list[Any]]:
    """``(is a structure, its tensor types)`` of a TFF value type; TypeError unless every leaf is a float tensor."""
    is_struct = isinstance(value_type, tff.StructType)
    leaves = tff.structure.flatten(value_type) if is_struct else [value_type]
    if not all(isinstance(leaf, tff.TensorType) and np.issubdtype(leaf.dtype, np.floating) for leaf in leaves):
        raise TypeError(f"RobustFactory aggregates structures of float tensors. Received: {value_type}")
    return is_struct, leaves


def _factory_class() -> type:
    """:class:`RobustFactory`, made on first use: its base class is TFF's."""
    from tensorfleet.compat.tff import import_tff

    tff: Any = import_tff("RobustFactory (the robust aggregators of the tff backend)")  # a base class here

    class RobustFactory(RobustStatistic, tff.aggregators.UnweightedAggregationFactory):
        """An unweighted TFF aggregation factory applying a :class:`RobustStatistic`'s rule to client updates.

        Takes the arguments of :class:`RobustStatistic`. Measurements: ``clients`` (updates received)
        and ``non_finite`` (updates dropped for NaN or infinity).
        """

        def create(self, value_type: Any) -> Any:
            value_type = tff.to_type(value_type)
            is_struct, leaves = _float_leaves(tff, value_type)
            shapes = [tuple(leaf.shape) for leaf in leaves]
            sizes = [int(np.prod(s)) for s in shapes]
            dim = int(sum(sizes))
            dtype = leaves[0].dtype
            stacked_type = tff.TensorType(dtype, [None, dim])
            row_type = tff.TensorType(dtype, [dim])

            @tff.tensorflow.computation(value_type)
            def flatten(value: Any) -> tf.Tensor:
                parts = [tf.reshape(tf.cast(t, dtype), [-1]) for t in tf.nest.flatten(value)]
                return tf.concat(parts, axis=0)

            @tff.tensorflow.computation
            def zero() -> tf.Tensor:
                return tf.zeros([0, dim], dtype)

            @tff.tensorflow.computation(stacked_type, row_type)
            def accumulate(acc: tf.Tensor, row: tf.Tensor) -> tf.Tensor:
                return tf.concat([acc, row[None, :]], axis=0)

            @tff.tensorflow.computation(stacked_type, stacked_type)
            def merge(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
                return tf.concat([a, b], axis=0)

            statistic = self.statistic

            @tff.tensorflow.computation(stacked_type)
            def report(stacked: tf.Tensor) -> Any:
                vector = statistic(stacked)
                pieces = tf.split(vector, sizes) if len(sizes) > 1 else [vector]
                leaves_out = [tf.reshape(p, s) for p, s in zip(pieces, shapes)]
                n = tf.shape(stacked)[0]
                finite = tf.reduce_sum(tf.cast(tf.reduce_all(tf.math.is_finite(stacked), axis=1), tf.int32))
                result = leaves_out if is_struct else leaves_out[0]
                return collections.OrderedDict(result=result, clients=n, non_finite=n - finite)

            @tff.federated_computation()
            def init_fn() -> Any:
                return tff.federated_value((), tff.SERVER)

            @tff.federated_computation(init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS))
            def next_fn(state: Any, value: Any) -> Any:
                rows = tff.federated_map(flatten, value)
                summary = tff.federated_aggregate(rows, zero(), accumulate, merge, report)
                measurements = tff.federated_zip(collections.OrderedDict(
                    clients=summary.clients, non_finite=summary.non_finite))
                return tff.templates.MeasuredProcessOutput(state=state, result=summary.result,
                                                           measurements=measurements)

            return tff.templates.AggregationProcess(init_fn, next_fn)

    RobustFactory.__module__ = __name__
    return RobustFactory


def __getattr__(name: str) -> Any:
    if name == "RobustFactory":  # made on first use: it needs tensorflow-federated
        return _factory_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
