"""secagg and secagg+ as aggregators of a simulation on the compiled backend."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import tensorfleet as tfl
from tensorfleet.federated.aggregators import AGGREGATORS
from tensorfleet.federated.aggregators.dp import epsilon
from tensorfleet.federated.aggregators.parts import AggregationError


@pytest.fixture(scope="module")
def digits():
    split = tfl.models.datasets.load_digits(flat=True)
    return split, tfl.federated.partition(split.x_train, split.y_train, num_clients=20, seed=0)


def _sim(digits, aggregator, options=None, **config):
    split, clients = digits
    settings = {"rounds": 2, "clients_per_round": 5, "seed": 3, "progress": False, **config}
    return tfl.federated.Simulation(lambda: tfl.models.build("digits_mlp"), clients, config.pop("algorithm", "fedavg"),
                                    aggregator=aggregator, aggregator_options=options,
                                    **{k: v for k, v in settings.items() if k != "algorithm"})


def test_secure_mean_at_32_bits_trains_as_the_plain_mean(digits):
    plain = _sim(digits, None)
    plain.run()
    secure = _sim(digits, "secagg", {"bits": 32, "clip": 1.0})
    history = secure.run()
    assert [r["aggregator_survivors"] for r in history.rounds] == [5, 5]
    assert [r["aggregator_saturated"] for r in history.rounds] == [0, 0]
    # a quantization step is 2 / (2**32 // 5), 2.3e-9: what differs is float32 rounding of the sums
    for a, b in zip(secure.final_weights(), plain.final_weights()):
        np.testing.assert_allclose(a, b, atol=2e-6)


@pytest.fixture(params=["secagg", "secagg+"])
def kept_part(request):
    """secagg (and secagg+) registered once more under a test name, keeping the part it builds within reach."""
    entry, made = AGGREGATORS.get(request.param), []

    def compiled(**options):
        made.append(entry.compiled(**options))
        return made[-1]

    AGGREGATORS.register("secagg_kept", dataclasses.replace(entry, compiled=compiled))
    yield request.param, made
    AGGREGATORS.unregister("secagg_kept")


def test_a_round_that_cannot_unmask_leaves_the_model_unchanged(digits, kept_part):
    kind, kept_part = kept_part
    plus = kind == "secagg+"  # a ring of degree 2: each secret has 3 holders, 2 needed
    sim = _sim(digits, "secagg_kept", {"bits": 16, **({"degree": 2} if plus else {})})
    kept = {}

    def after_round(record):  # round 1 went through; make round 2 lose too many clients after upload
        kept["weights"] = [np.array(w) for w in sim.state.model_weights().trainable]
        kept_part[-1].dropout_after_upload = 0.6

    sim.round_listeners.append(after_round)
    # 3 of 5 stop after upload: SecAgg is short of its 3 of 5; in SecAgg+'s ring of 5, some client's 3 holders
    # keep at most 1
    shortfall = r"needs 2 shares of 3, and only [01]" if plus else r"needs 3 shares of 5, and only 2"
    with pytest.raises(AggregationError, match=rf"round 2 cannot unmask: .* {shortfall}"):
        sim.run()
    assert [r["round"] for r in sim.history.rounds] == [1]
    for a, b in zip(sim.state.model_weights().trainable, kept["weights"]):
        np.testing.assert_array_equal(np.asarray(a), b)


@pytest.mark.parametrize("algorithm, dp", [("fedsgd", False), ("fedprox", False), ("fednova", False),
                                           ("fedadam", True)])
def test_composes_with_algorithms_dp_dropout_and_partial_stragglers(digits, algorithm, dp):
    options = {"bits": 16, "threshold": 0.3, "dropout_after_upload": 0.2}
    if dp:
        options.update(noise_multiplier=1.0, dp_clip=0.5)
    sim = _sim(digits, "secagg+", options, algorithm=algorithm, rounds=1, clients_per_round=8, dropout=0.2,
               straggler_share=0.5, straggler_deadline=1e9, straggler_policy="partial", local_epochs=2)
    record = sim.run().rounds[0]
    assert record["aggregator_survivors"] == record["participants"]
    assert record["aggregator_dropped_after_upload"] == round(0.2 * record["participants"])
    assert all(np.isfinite(w).all() for w in sim.final_weights())
    if dp:  # central noise after unmasking, accounted as dp_fixed
        assert record["epsilon"] == pytest.approx(
            epsilon(noise_multiplier=1.0, clients_per_round=8, num_clients=len(sim.train_ids), rounds=1))
    else:  # no noise: no privacy claimed
        assert record.get("epsilon", math.inf) == math.inf


def test_tff_backend_refuses_secure_aggregators_naming_compiled(digits):
    with pytest.raises(ValueError, match="compiled"):
        _sim(digits, "secagg", backend="tff")


@pytest.mark.parametrize("options, error, message", [
    ({"bits": 2}, ValueError, r"use bits >= 3. Received: bits=2"),
    ({"degree": 3}, ValueError, r"degree must be even .* Received: degree=3"),
    ({"dropout_after_upload": 1.0}, ValueError, r"dropout_after_upload must be a finite number >= 0 and < 1"),
    ({"bit": 16}, TypeError, r"takes no option 'bit'"),
])
def test_bad_options_fail_when_the_simulation_is_made(digits, options, error, message):
    with pytest.raises(error, match=message):
        _sim(digits, "secagg+", options)
