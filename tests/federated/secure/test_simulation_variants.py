"""Distributed DP and the malicious-server variant as options of a simulation's secagg aggregators."""

from __future__ import annotations

import numpy as np
import pytest

import tensorfleet as tfl
from tensorfleet.federated.secure import SecureAggregator


@pytest.fixture(scope="module")
def digits():
    split = tfl.models.datasets.load_digits(flat=True)
    return split, tfl.federated.partition(split.x_train, split.y_train, num_clients=12, seed=0)


def test_distributed_dp_with_a_malicious_server_check_trains_and_reports_its_epsilon(digits):
    split, clients = digits
    options = {"bits": 24, "noise_multiplier": 0.3, "dp_clip": 1.0, "clip": 0.5, "dp": "distributed",
               "malicious": True}
    sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_mlp"), clients, "fedavg", aggregator="secagg+",
                                   aggregator_options=options, rounds=2, clients_per_round=5, seed=3,
                                   progress=False, dp_delta=1e-6)
    history = sim.run()
    size = sum(int(np.prod(w.shape)) for w in sim.keras_model().trainable_weights)
    aggregator = SecureAggregator(kind="secagg+", bits=24, noise_multiplier=0.3, dp_clip=1.0, clip=0.5,
                                  dp="distributed", malicious=True)
    for record in history.rounds:
        assert "epsilon" not in record  # not the central Gaussian's: the part reports the Skellam bound
        # at the simulation's dp_delta (a smaller delta: a larger epsilon than at the default 1e-5)
        at = {delta: aggregator.epsilon(clients_per_round=5, num_clients=12, rounds=record["round"], size=size,
                                        delta=delta) for delta in (1e-6, 1e-5)}
        assert record["aggregator_epsilon"] == pytest.approx(at[1e-6], rel=1e-12) and at[1e-6] > at[1e-5]
        assert record["aggregator_survivors"] == 5
    assert history.rounds[1]["aggregator_epsilon"] > history.rounds[0]["aggregator_epsilon"] > 0
    assert all(np.isfinite(w).all() for w in sim.final_weights())


def test_too_few_bits_for_the_models_noise_margin_fail_when_the_simulation_starts(digits):
    """6 bits hold 5 clients' noise on one value, so the configuration is accepted; the margin for
    the digits MLP's 4,810 values needs 7, and the run stops before any client trains."""
    split, clients = digits
    options = {"bits": 6, "noise_multiplier": 1.0, "dp": "distributed"}
    sim = tfl.federated.Simulation(lambda: tfl.models.build("digits_mlp"), clients, "fedavg", aggregator="secagg",
                                   aggregator_options=options, rounds=1, clients_per_round=5, seed=3, progress=False)
    listened = []
    sim.round_listeners.append(listened.append)
    with pytest.raises(ValueError, match=r"^bits=6 leave no room for distributed DP's noise on updates of 4,810 "
                                         r"values: .*; use bits >= 7\. Received: bits=6$"):
        sim.run()
    assert sim.rounds.engine is None and sim.history.rounds == [] and listened == []  # no client work
    enough = tfl.federated.Simulation(lambda: tfl.models.build("digits_mlp"), clients, "fedavg",
                                      aggregator="secagg", aggregator_options={**options, "bits": 7}, rounds=1,
                                      clients_per_round=5, seed=3, progress=False)
    assert enough.run().rounds[0]["aggregator_survivors"] == 5  # the bits the error names run
