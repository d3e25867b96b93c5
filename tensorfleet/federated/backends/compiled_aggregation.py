"""What the compiled backend's round does with the clients' updates for each aggregator:
:func:`aggregation` turns an aggregator's name and options into the arguments of
:class:`~tensorfleet.federated.backends.compiled.CompiledFedAvg`; :func:`dp_noised_mean` and
:func:`adapted_clip` are TFF's DP-FedAvg noise and adaptive-clipping rules (Andrew et al. 2021) in
TensorFlow, with the noise drawn statelessly from the seed and the round.

Example:
    >>> aggregation("dp_fixed", 10, {"clip": 0.5})
    {'dp_clip': 0.5, 'dp_noise': 1.0}
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Sequence

__all__ = ["ROBUST_AGGREGATORS", "adapted_clip", "aggregation", "compress_rows", "dp_noised_mean"]

# Aggregators compiled runs besides the mean (None): unweighted rules over the stacked updates.
ROBUST_AGGREGATORS = ("median", "trimmed_mean", "krum")


def aggregation(name: str | None, clients_per_round: int, options: dict[str, Any]) -> dict[str, Any]:
    """The :class:`CompiledFedAvg` arguments of aggregator ``name`` with ``options``, checked as
    :func:`~tensorfleet.federated.aggregators.build_aggregator` checks them (without TFF)."""
    if name in (None, "mean"):
        return {}
    from tensorfleet.federated.aggregators import AGGREGATORS, check_aggregator_options
    from tensorfleet.validation import number

    check_aggregator_options(name, options, clients_per_round=clients_per_round)
    given = {**{k: p.default for k, p in inspect.signature(AGGREGATORS.get(name)).parameters.items()
                if k != "clients_per_round"}, **options}
    if name in ROBUST_AGGREGATORS:
        from tensorfleet.federated.aggregators.robust import RobustStatistic

        return {"statistic": RobustStatistic(name, **given).statistic}
    if name in ("dp_fixed", "dp_adaptive"):
        noise = float(number("noise_multiplier", given["noise_multiplier"], minimum=0))
        clip = float(number("clip", given["clip"], above=0))
        if name == "dp_fixed":
            return {"dp_clip": clip, "dp_noise": noise}
        target = float(number("target_quantile", given["target_quantile"], above=0, below=1))
        rate = float(number("clip_learning_rate", given["clip_learning_rate"], above=0))
        count_stddev = 0.05 * clients_per_round if noise > 0 else 0.0  # TFF's adaptive_clip_noise_params
        value_noise = (noise ** -2 - (2 * count_stddev) ** -2) ** -0.5 if noise > 0 else 0.0
        return {"dp_clip": clip, "dp_noise": value_noise, "dp_adaptive": (target, rate, count_stddev)}
    from tensorfleet.federated.aggregators.compression import Compression

    compression = Compression(bits=given["bits"], sparsity=given["sparsity"])  # checks the options
    return {"compress": functools.partial(compress_rows, bits=compression.bits, sparsity=compression.sparsity)}


def compress_rows(rows: Any, *, bits: int, sparsity: float) -> Any:
    """Every row of ``rows`` (``[count, n]``) as a client sends that tensor under the ``compression``
    aggregator: what ``CompressionFactory.compress`` computes (the kept values, then quantized over the
    row's own ``[min, max]``).

    The kept values are those the reference's stable argsort keeps (ties at the lowest index):
    for rows of up to 2,048 values by an unsorted ``top_k`` (which breaks ties the same way); for
    longer ones by a radix select, as ``top_k`` costs about 1.7 ms for 32,768 values against 0.8:
    the bits of each row's ``k``-th largest magnitude (magnitudes order as their int32 bits) from
    three per-row histograms of 10, 11 and 10 bits, then every larger value and the first ties up
    to ``k``.
    """
    import tensorflow as tf

    from tensorfleet.federated.aggregators.aggregate import kept_count

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
    return tf.where(scale > 0, lo + tf.round((rows - lo) / safe) * safe, rows)  # tf_quantize's arithmetic, per row


def _top_mask(bits: Any, k: int) -> Any:
    """Which of each row's non-negative int32 ``bits`` the stable descending argsort puts in its first
    ``k`` (in a row whose ``k``-th largest is 0, every 0 as well: its values are the same)."""
    import tensorflow as tf

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
    import tensorflow as tf

    most = tf.reduce_max(need)

    def few() -> Any:
        columns = tf.range(tf.shape(tie)[1])[None, :]
        firsts = -tf.math.top_k(-tf.where(tie, columns, tf.shape(tie)[1]), tf.maximum(most, 1)).values
        last = tf.gather(firsts, tf.maximum(need - 1, 0), batch_dims=1)  # the need-th tie's position
        return tie & (columns <= last) & (need > 0)

    return tf.cond(most <= 64, few, lambda: tie & (tf.math.cumsum(tf.cast(tie, tf.int32), axis=1) <= need))


def dp_noised_mean(clipped_sum: Sequence[Any], stddev: float, denominator: int, seed: int, round_num: Any) -> list[Any]:
    """TFF's DP-FedAvg result from the clipped sum (``NormalizedQuery(GaussianSumQuery)``): every
    tensor plus Gaussian noise of ``stddev``, over ``denominator``. The noise is drawn statelessly
    from ``seed`` and ``round_num`` (so a resumed run draws what the uninterrupted one did)."""
    import tensorflow as tf

    round_num = tf.cast(round_num, tf.int64)
    out = []
    for i, total in enumerate(clipped_sum):
        key = tf.stack([tf.constant(seed, tf.int64), round_num * len(clipped_sum) + i])
        noise = tf.random.stateless_normal(tf.shape(total), key, stddev=stddev, dtype=total.dtype)
        out.append((total + noise) / float(denominator))
    return out


def adapted_clip(clip: Any, unclipped_sum: Any, adaptive: tuple[float, float, float], denominator: int, seed: int,
                 round_num: Any) -> Any:
    """The next clip of TFF's adaptive clipping (tensorflow_privacy's ``QuantileEstimatorQuery``,
    geometric update): ``unclipped_sum`` is the sum over clients of ``[norm <= clip] - 0.5``."""
    import tensorflow as tf

    target, learning_rate, count_stddev = adaptive
    key = tf.stack([tf.constant(seed, tf.int64), -1 - tf.cast(round_num, tf.int64)])
    noised = (unclipped_sum + tf.random.stateless_normal([], key, stddev=count_stddev)) / float(denominator)
    below = tf.minimum(1.0, tf.maximum(0.0, noised + 0.5))
    return tf.maximum(clip * tf.math.exp(-(learning_rate * (below - target))), 0.0)
