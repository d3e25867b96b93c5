"""Distributed DP under secure aggregation: each client's Skellam noise added before masking."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tensorfleet.federated.aggregators import AGGREGATORS
from tensorfleet.federated.secure import Dropouts, SecureAggregator, TooFewSurvivorsError
from tensorfleet.federated.secure.protocol import make_clients, run_round
from tensorfleet.federated.secure.skellam import tail_margin

CLIENTS, SIZE = 6, 20_000


def _updates(rng, clients=CLIENTS, size=SIZE, norm=1.0):
    rows = rng.normal(0.0, 1.0, (clients, size))
    return list(rows * (norm / np.linalg.norm(rows, axis=1, keepdims=True)))  # already within dp_clip


def _noised_round(aggregator, updates, dropouts, seed):
    """One round run with the clients in hand: (the plan, the clients, the unmasked sum)."""
    n, d = len(updates), updates[0].size
    settings = aggregator.settings(n, d, round_num=3)
    rng = np.random.default_rng(seed)
    clients = make_clients(n, settings, rng)
    result, view = run_round(updates, settings, dropouts=dropouts, rng=rng, clients=clients)
    assert all(item.vector.dtype == settings.quantizer.dtype for item in view.masked)
    return aggregator.skellam_plan(n, d), clients, result


@pytest.fixture(scope="module")
def noised():
    aggregator = SecureAggregator(kind="secagg", bits=32, clip=0.05, noise_multiplier=0.8, dp_clip=1.0,
                                  dp="distributed")
    return aggregator, _noised_round(aggregator, _updates(np.random.default_rng(0)), Dropouts(), seed=11)


def test_unmasked_sum_is_true_sum_plus_the_clients_noise_exactly(noised):
    aggregator, (plan, clients, result) = noised
    decoded = plan.decode(result.values, len(result.clients))
    true_sum = np.sum([c._plain.astype(np.int64) for c in clients], axis=0)
    noise_sum = np.sum([c._noise for c in clients], axis=0)
    np.testing.assert_array_equal(decoded - true_sum, noise_sum)
    assert np.count_nonzero(noise_sum) > 0.99 * SIZE  # the server never sees the un-noised sum
    assert (decoded < 0).any() or (decoded > CLIENTS * plan.levels).any() or decoded.min() >= 0  # decoded signed
    # the same seeds give the same sum bit for bit (masks and keys differ run to run and cancel)
    again = _noised_round(aggregator, _updates(np.random.default_rng(0)), Dropouts(), seed=11)[2]
    np.testing.assert_array_equal(again.total, result.total)


def test_noise_variance_of_the_sum_is_mu(noised):
    _, (plan, clients, result) = noised
    noise_sum = np.sum([c._noise for c in clients], axis=0).astype(np.float64)
    # the sample variance of N draws has relative stddev sqrt((2 + excess kurtosis) / N); Skellam's
    # excess kurtosis is 1 / mu. Five of those: a false failure once in ~10^6 runs.
    tolerance = 5 * math.sqrt((2 + 1 / plan.mu) / SIZE)
    assert abs(noise_sum.var() / plan.mu - 1) < tolerance
    assert abs(noise_sum.mean()) < 5 * math.sqrt(plan.mu / SIZE)
    per_client = np.stack([c._noise for c in clients]).astype(np.float64)
    assert abs(per_client.var() / plan.client_mu - 1) < 5 * math.sqrt((2 + 1 / plan.client_mu) / per_client.size)


def test_dropouts_leave_the_survivors_noise_only():
    aggregator = SecureAggregator(kind="secagg+", bits=24, clip=0.05, noise_multiplier=1.0, dp="distributed")
    updates = _updates(np.random.default_rng(1), clients=8, size=2_000)
    plan, clients, result = _noised_round(aggregator, updates, Dropouts(before_upload=[1, 5], after_upload=[2]),
                                          seed=5)
    assert result.clients == (0, 2, 3, 4, 6, 7)  # a vector that arrived counts, its sender answering or not
    survivors = [c for c in clients if c.client in result.clients]
    assert clients[1]._noise is None and clients[5]._noise is None
    decoded = plan.decode(result.values, len(survivors))
    np.testing.assert_array_equal(decoded - np.sum([c._plain.astype(np.int64) for c in survivors], axis=0),
                                  np.sum([c._noise for c in survivors], axis=0))
    # fewer clients, less noise: epsilon is accounted for the fewest survivors a round releases with
    assert plan.min_survivors == 5
    eps = {m: plan.epsilon(rounds=1, delta=1e-5, survivors=m) for m in (5, 6, 8)}
    assert eps[5] > eps[6] > eps[8] and plan.epsilon(rounds=1, delta=1e-5) == eps[5]
    # 4 clients that shared keys can unmask their own sum, but it carries too little noise: refused
    with pytest.raises(TooFewSurvivorsError, match="4 survivors; distributed DP releases a sum of at least 5"):
        aggregator.aggregate(updates, round_num=0, dropouts=Dropouts(before_keys=[0, 1, 2, 3]))


def _reference_epsilon(*, clip, dp_clip, noise_multiplier, bits, clients, size, survivors, rounds, delta):
    """The Skellam mechanism's epsilon written out here from the papers' formulas."""
    room = 2 ** bits - 1
    gamma = lambda levels: levels / (2 * clip)  # noqa: E731  grid steps per unit
    finest = math.floor(2 * clip * math.sqrt(2 * clients * 2 ** 32) / (noise_multiplier * dp_clip))
    fits = [levels for levels in range(2, min(room // clients, finest) + 1)
            if clients * levels + 2 * tail_margin((noise_multiplier * dp_clip * gamma(levels)) ** 2, size) <= room]
    levels = max(fits)
    mu = (noise_multiplier * dp_clip * gamma(levels)) ** 2 * survivors / clients
    norm = gamma(levels) * min(dp_clip, clip * math.sqrt(size))
    bound = math.sqrt(norm ** 2 + size / 4 + (norm + math.sqrt(size) / 2))  # Kairouz et al. 2021, beta = e^-1/2
    l2 = 2 * bound
    l1 = min(math.sqrt(size) * l2, l2 ** 2)
    best = math.inf
    for a in range(2, 257):  # Agarwal et al. 2021, Theorem 3.5; then Canonne et al.'s conversion
        rdp = rounds * (a * l2 ** 2 / (2 * mu) + min(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * mu ** 2),
                                                     3 * l1 / (2 * mu)))
        best = min(best, rdp + math.log1p(-1 / a) - math.log(delta * a) / (a - 1))
    return levels, max(best, 0.0)


@pytest.mark.parametrize("noise_multiplier,rounds", [(1.0, 1), (1.0, 20), (4.0, 20)])
def test_epsilon_equals_the_formula_and_is_monotone(noise_multiplier, rounds):
    options = dict(clip=0.1, dp_clip=0.5, noise_multiplier=noise_multiplier, bits=14)
    aggregator = SecureAggregator(dp="distributed", threshold=0.5, **options)
    levels, expected = _reference_epsilon(**options, clients=10, size=300, survivors=6, rounds=rounds, delta=1e-5)
    assert aggregator.skellam_plan(10, 300).levels == levels
    got = aggregator.epsilon(clients_per_round=10, num_clients=1000, rounds=rounds, delta=1e-5, size=300)
    assert got == pytest.approx(expected, rel=1e-9)
    more_rounds = aggregator.epsilon(clients_per_round=10, num_clients=1000, rounds=rounds + 1, size=300)
    more_noise = SecureAggregator(dp="distributed", **{**options, "noise_multiplier": noise_multiplier * 1.5})
    assert more_rounds > got > more_noise.epsilon(clients_per_round=10, num_clients=1000, rounds=rounds, size=300)


def test_mean_of_a_distributed_dp_round_is_unbiased_within_its_noise():
    updates = _updates(np.random.default_rng(2), clients=5, size=4_000, norm=0.5)
    aggregator = SecureAggregator(bits=32, clip=0.05, noise_multiplier=0.5, dp="distributed")
    result = aggregator.aggregate(updates, round_num=1)
    residual = result.mean - np.mean(updates, axis=0)
    # noise of stddev noise_multiplier * dp_clip on the sum, over 5 clients (the rounding adds far less);
    # the sample stddev of N draws has relative stddev 1 / sqrt(2N): five of those
    assert abs(residual.std() / (0.5 * 1.0 / 5) - 1) < 5 / math.sqrt(2 * 4_000)
    assert abs(residual.mean()) < 5 * 0.1 / math.sqrt(4_000)


def test_too_few_bits_name_the_bits_needed_and_bad_combinations_are_refused():
    with pytest.raises(ValueError, match=r"bits=6 leave no room for distributed DP's noise.*use bits >= 7"):
        SecureAggregator(bits=6, noise_multiplier=1.0, dp="distributed").quantizer(10, 1000)
    with pytest.raises(ValueError, match=r"use bits >= 7\. Received: bits=6"):
        AGGREGATORS.get("secagg").compiled(clients_per_round=10, seed=0, bits=6, noise_multiplier=1.0,
                                           dp="distributed", clip=1.0, threshold=0.5, degree=0, dp_clip=1.0,
                                           malicious=False, dropout_after_upload=0.0)
    with pytest.raises(ValueError, match="needs noise_multiplier > 0"):
        SecureAggregator(dp="distributed")
    with pytest.raises(ValueError, match="dp"):
        SecureAggregator(dp="local", noise_multiplier=1.0)
    with pytest.raises(ValueError, match="pass size="):
        SecureAggregator(dp="distributed", noise_multiplier=1.0).epsilon(clients_per_round=5, num_clients=9, rounds=1)
