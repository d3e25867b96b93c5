"""SecureAggregator: the dequantized mean, saturation counts, central DP, and bad options."""

from __future__ import annotations

import numpy as np
import pytest

from tensorfleet.federated.aggregators.dp import epsilon
from tensorfleet.federated.secure import Dropouts, Quantizer, SecureAggregator, TooFewSurvivorsError
from tensorfleet.federated.secure.graph import default_degree, neighbours


@pytest.mark.parametrize("kind", ["secagg", "secagg+"])
@pytest.mark.parametrize("bits", [16, 32])
def test_mean_is_within_one_quantization_step_of_the_float_mean(kind, bits):
    updates = np.random.default_rng(0).normal(0, 0.3, (12, 500)).astype(np.float32)
    aggregator = SecureAggregator(kind=kind, clip=1.0, bits=bits, threshold=0.3)
    result = aggregator.aggregate(list(updates), round_num=2, dropouts=Dropouts(before_upload=[3]))
    kept = np.delete(updates, 3, axis=0)
    error = np.abs(result.mean - np.clip(kept, -1, 1).astype(np.float64).mean(axis=0))
    step = aggregator.quantizer(12).step
    assert result.clients == 11
    assert error.max() <= step + 1e-6  # float32's rounding of the output, for values up to 1
    if bits == 16:  # (at 32 bits a step, 6e-9, is below float32 resolution)
        assert error.mean() < step / 4  # unbiased rounding: errors average out


def test_saturation_is_counted_and_reported():
    updates = [np.zeros(50), np.zeros(50), np.zeros(50)]
    updates[0][:3] = 5.0
    updates[2][10:17] = -1.5
    result = SecureAggregator(clip=1.0, bits=20).aggregate(updates, round_num=0)
    assert (result.saturated_clients, result.saturated_values) == (2, 10)
    assert result.as_dict()["saturated_values"] == 10
    assert "10 values of 2 clients saturated the clip" in result.describe()


def test_central_dp_noise_and_its_epsilon():
    rng = np.random.default_rng(1)
    updates = list(rng.normal(0, 0.001, (8, 20_000)))
    updates[0] = np.full(20_000, 1.0)  # L2 norm 141: clipped to dp_clip
    plain = SecureAggregator(bits=32, clip=1.0).aggregate(updates, round_num=1)
    noisy_aggregator = SecureAggregator(bits=32, clip=1.0, noise_multiplier=2.0, dp_clip=0.5)
    noisy = noisy_aggregator.aggregate(updates, round_num=1)
    clipped_first = 0.5 / np.sqrt(20_000)
    expected_mean = (clipped_first + np.stack(updates[1:]).sum(axis=0)) / 8
    residual = noisy.mean - expected_mean
    assert abs(residual.std() / (2.0 * 0.5 / 8) - 1) < 0.05  # stddev noise_multiplier * dp_clip over 8
    assert abs(residual.mean()) < 5 * 0.125 / np.sqrt(20_000)
    assert abs(plain.mean[0] - (1.0 + updates[1][0] * 0 + np.stack(updates[1:])[:, 0].sum()) / 8) < 1e-6
    assert noisy_aggregator.epsilon(clients_per_round=8, num_clients=100, rounds=3) == epsilon(
        noise_multiplier=2.0, clients_per_round=8, num_clients=100, rounds=3)


def test_too_few_survivors_raise_before_any_result():
    aggregator = SecureAggregator(kind="secagg", bits=16)
    with pytest.raises(TooFewSurvivorsError, match="needs 3 shares of 4, and only 2"):
        aggregator.aggregate([np.zeros(4)] * 4, round_num=0, dropouts=Dropouts(after_upload=[0, 1]))


@pytest.mark.parametrize("options, message", [
    ({"kind": "secagg++"}, "kind must be one of"),
    ({"bits": 1}, r"bits must be an integer from 2 to 62. Received: bits=1"),
    ({"threshold": 1.0}, r"threshold must be a finite number >= 0 and < 1. Received: threshold=1.0"),
    ({"clip": 0}, r"clip must be a finite number > 0. Received: clip=0"),
    ({"kind": "secagg+", "degree": 5}, r"degree must be even .* Received: degree=5"),
])
def test_bad_options_name_the_value(options, message):
    with pytest.raises(ValueError, match=message):
        SecureAggregator(**options)


def test_bits_too_few_for_the_clients_say_how_many():
    assert Quantizer(clip=1.0, bits=7, clients=100).levels == 1  # 100 * 1 <= 2 ** 7 - 1
    with pytest.raises(ValueError, match=r"use bits >= 7. Received: bits=6"):
        Quantizer(clip=1.0, bits=6, clients=100)


def test_secagg_plus_graph_is_regular_of_logarithmic_degree():
    assert [default_degree(n) for n in (10, 100, 1000)] == [8, 14, 20]
    graph = neighbours(100, degree=14, seed=3)
    assert {len(g) for g in graph} == {14} and all(u in graph[v] for u in range(100) for v in graph[u])
    with pytest.raises(ValueError, match="degree must be even .* Received: degree=5"):
        neighbours(10, degree=5, seed=0)


def test_weighted_mean_within_the_quantization_bound():
    updates = np.random.default_rng(2).normal(0, 0.3, (6, 400))
    weights = np.array([10, 250, 40, 90, 250, 5], np.float64)
    aggregator = SecureAggregator(kind="secagg+", clip=1.0, bits=16, threshold=0.3)
    result = aggregator.aggregate(list(updates), round_num=0, weights=weights)
    reference = (np.clip(updates, -1, 1) * weights[:, None]).sum(axis=0) / weights.sum()
    q = aggregator.quantizer(6)
    # numerator: 6 clients' rounding of under a step each; denominator: 6 weights' of under 1 / levels
    scaled_total = weights.sum() / weights.max()
    bound = (6 * q.step + 1.0 * 6 / q.levels) / (scaled_total - 6 / q.levels)
    assert np.abs(result.mean - reference).max() <= bound + 1e-6
