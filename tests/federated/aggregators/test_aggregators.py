"""The aggregators' TensorFlow rules against the numpy math, alone and (tff track) as TFF factories run in TFF
(on tensorfleet's worker)."""

from __future__ import annotations

import numpy as np
import pytest

from tensorfleet.federated.aggregators import aggregate as agg
from tensorfleet.registry import UnknownNameError


@pytest.fixture(scope="module")
def tff_env():
    import tensorflow_federated as tff

    from tensorfleet.federated.backends.tff import install_default

    rt = install_default()
    yield tff
    rt.stop()


def _client_values(u):
    return [[row[:6].reshape(2, 3), row[6:]] for row in u]


def _joined(result):
    return np.concatenate([np.asarray(result[0]).ravel(), np.asarray(result[1])])


RULES = [
    ("median", {}, lambda u: agg.coordinate_median(u)),
    ("trimmed_mean", {"beta": 0.2}, lambda u: agg.trimmed_mean(u, 0.2)),
    ("krum", {"num_byzantine": 1, "num_selected": 2}, lambda u: agg.krum(u, 1, 2)),
]


def _updates():
    u = np.random.default_rng(0).normal(size=(7, 10)).astype(np.float32)
    u[2, 3] = np.nan
    u[5] *= 100.0
    return u


@pytest.mark.parametrize("rule,options,reference", RULES)
def test_robust_statistics_equal_the_numpy_rules_and_drop_nan_clients(rule, options, reference):
    from tensorfleet.federated.aggregators.robust import RobustStatistic

    u = _updates()
    ours = RobustStatistic(rule, **options).statistic(u).numpy()
    np.testing.assert_allclose(ours, reference(u.astype(np.float64)), rtol=0, atol=1e-6)


def test_compression_is_sparsify_then_quantize_of_each_tensor():
    import tensorflow as tf

    from tensorfleet.federated.aggregators.compression import Compression

    for row in np.random.default_rng(1).normal(size=(3, 10)).astype(np.float32):
        ours = Compression(bits=4, sparsity=0.5).compress(tf.constant(row)).numpy()
        np.testing.assert_allclose(ours, agg.quantize(agg.sparsify(row.astype(np.float64), 0.5), 4), rtol=0, atol=1e-6)


@pytest.mark.tff
@pytest.mark.parametrize("rule,options,reference", RULES)
def test_robust_factories_equal_the_numpy_rules_and_drop_nan_clients(tff_env, rule, options, reference):
    from tensorfleet.federated.aggregators.robust import RobustFactory

    tff = tff_env
    u = _updates()
    process = RobustFactory(rule, **options).create(tff.to_type([(np.float32, (2, 3)), (np.float32, (4,))]))
    out = process.next(process.initialize(), _client_values(u))
    np.testing.assert_allclose(_joined(out.result), reference(u.astype(np.float64)), atol=1e-6)
    assert dict(out.measurements) == {"clients": 7, "non_finite": 1}


@pytest.mark.tff
def test_compression_factory_sums_the_sparsified_then_quantized_updates(tff_env):
    from tensorfleet.federated.aggregators.compression import CompressionFactory

    tff = tff_env
    rng = np.random.default_rng(1)
    u = rng.normal(size=(3, 10)).astype(np.float32)
    process = CompressionFactory(bits=4, sparsity=0.5).create(tff.to_type([(np.float32, (2, 3)), (np.float32, (4,))]))
    out = process.next(process.initialize(), _client_values(u))
    expected = sum(np.concatenate([agg.quantize(agg.sparsify(row[:6], 0.5), 4),
                                   agg.quantize(agg.sparsify(row[6:], 0.5), 4)])
                   for row in u.astype(np.float64))
    np.testing.assert_allclose(_joined(out.result), expected, atol=1e-5)


@pytest.mark.tff
def test_dp_without_noise_is_the_mean_of_clipped_updates(tff_env):
    from tensorfleet.federated.aggregators import build_aggregator

    tff = tff_env
    u = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, -2.0]], dtype=np.float32)
    factory = build_aggregator("dp_fixed", clients_per_round=3, noise_multiplier=0.0, clip=1.0)
    process = factory.create(tff.to_type((np.float32, (2,))))
    out = process.next(process.initialize(), list(u))
    expected = np.mean([agg.clip_by_l2_norm(r.astype(np.float64), 1.0) for r in u], axis=0)
    np.testing.assert_allclose(np.asarray(out.result), expected, atol=1e-6)


def test_unknown_aggregator_and_option_are_refused():
    from tensorfleet.federated.aggregators import build_aggregator

    with pytest.raises(UnknownNameError, match=r"Unknown aggregator 'krumm'. Did you mean 'krum'\? Available: mean, "
                                               r"dp_fixed, dp_adaptive, compression, median, trimmed_mean, krum"):
        build_aggregator("krumm", clients_per_round=2)
    with pytest.raises(TypeError,
                       match=r"Aggregator 'median' takes no option 'beta' \(its options: none\). Received: beta=0.1"):
        build_aggregator("median", clients_per_round=2, beta=0.1)


def test_robust_rules_reject_bad_options():
    from tensorfleet.federated.aggregators.robust import RobustStatistic

    with pytest.raises(ValueError, match=r"beta must be a finite number >= 0 and < 0.5. Received: beta=0.7"):
        RobustStatistic("trimmed_mean", beta=0.7)
    with pytest.raises(ValueError,
                       match=r"rule must be one of 'median', 'trimmed_mean', 'krum'. Received: rule='mode'"):
        RobustStatistic("mode")


@pytest.mark.tff
def test_robust_factory_rejects_bad_options():
    from tensorfleet.federated.aggregators.robust import RobustFactory

    with pytest.raises(ValueError, match=r"beta must be a finite number >= 0 and < 0.5. Received: beta=0.7"):
        RobustFactory("trimmed_mean", beta=0.7)


@pytest.mark.tff
def test_krum_factory_fails_the_round_with_too_few_updates(tff_env):
    from tensorfleet.federated.aggregators.robust import RobustFactory

    tff = tff_env
    process = RobustFactory("krum", num_byzantine=1).create(tff.to_type((np.float32, (2,))))
    assert process.next(process.initialize(), [np.full(2, v, np.float32) for v in range(5)]).result.tolist() == [1, 1]
    with pytest.raises(Exception, match=r"Krum needs more than 2 \* num_byzantine \+ 2 clients \(n > 2f \+ 2, "
                                        r"Blanchard et al. 2017\): with num_byzantine=1, at least 5. Received updates"):
        process.next(process.initialize(), [np.full(2, v, np.float32) for v in range(4)])
