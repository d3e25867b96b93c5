"""How many clients each aggregator needs: a property of its registered record (``Aggregator.min_clients``),
checked once when the configuration is made (against ``clients_per_round``) and before every round (against the
participants that dropouts and stragglers leave), with one error for every aggregator."""

from __future__ import annotations

import pytest

from tensorfleet.federated.aggregators import AGGREGATORS, build_part
from tensorfleet.federated.aggregators.builtin import MeanPart
from tensorfleet.federated.aggregators.parts import Aggregator
from tensorfleet.federated.config import SimulationConfig
from tensorfleet.federated.records import check_participants


def test_every_registered_aggregator_says_how_many_clients_it_needs():
    fewest = {e.name: e.obj.fewest_clients({})[0] for e in AGGREGATORS.entries() if not e.name.startswith("test_")}
    assert fewest == {"mean": 1, "dp_fixed": 1, "dp_adaptive": 1, "compression": 1, "median": 1, "trimmed_mean": 1,
                      "krum": 5, "secagg": 2, "secagg+": 2}
    assert AGGREGATORS.get("krum").fewest_clients({"num_byzantine": 3})[0] == 9  # n > 2f + 2


@pytest.mark.parametrize("name, options, clients, message", [
    ("krum", {"num_byzantine": 2}, 6, r"^Aggregator 'krum' needs at least 7 clients \(n > 2 \* num_byzantine \+ 2, "
                                      r"Blanchard et al. 2017; num_byzantine=2\). Received: clients_per_round=6$"),
    ("secagg", {}, 1, r"^Aggregator 'secagg' needs at least 2 clients \(the fewest clients_per_round its compiled "
                      r"form accepts\). Received: clients_per_round=1$"),
    ("secagg+", {}, 1, r"^Aggregator 'secagg\+' needs at least 2 clients .* Received: clients_per_round=1$"),
    ("test_needs_three", {}, 2, r"^Aggregator 'test_needs_three' needs at least 3 clients \(a rule of its own\)\. "
                                r"Received: clients_per_round=2$"),
])
def test_too_few_clients_per_round_is_refused_when_the_config_is_made(name, options, clients, message):
    with pytest.raises(ValueError, match=message):
        SimulationConfig(aggregator=name, aggregator_options=options, clients_per_round=clients)
    SimulationConfig(aggregator=name, aggregator_options=options, clients_per_round=clients + 1)  # one more is enough


@pytest.mark.parametrize("name, participants, message", [
    ("krum", 4, r"^Round 3: Aggregator 'krum' needs at least 5 clients \(n > 2 \* num_byzantine \+ 2, Blanchard et "
                r"al. 2017; num_byzantine=1\). Received: participants=4 \(3 of 7 sampled clients dropped out, 0 missed "
                r"the straggler deadline\)$"),
    ("secagg", 1, r"^Round 3: Aggregator 'secagg' needs at least 2 clients .* Received: participants=1 \(6 of 7 "),
    ("test_needs_three", 2, r"^Round 3: Aggregator 'test_needs_three' needs at least 3 clients \(a rule of its "
                            r"own\)\. Received: participants=2 "),
])
def test_a_round_left_with_too_few_participants_is_refused_before_training(name, participants, message):
    config = SimulationConfig(aggregator=name, clients_per_round=7)
    ids = [f"c{i}" for i in range(7)]
    who = {"sampled": ids, "participants": ids[:participants], "dropped": ids[participants:], "stragglers": []}
    with pytest.raises(ValueError, match=message):
        check_participants(config, who, 3)
    check_participants(config, {**who, "participants": ids[:participants + 1]}, 3)  # one more is enough
    check_participants(config, {**who, "participants": []}, 3)  # nobody left: the round is skipped, not refused
    check_participants(SimulationConfig(clients_per_round=7), {**who, "participants": ids[:1]}, 3)  # the mean: 1


def test_an_aggregator_of_ones_own_without_a_rule_needs_what_its_factory_accepts():
    def factory(clients_per_round, seed):
        if clients_per_round < 4:
            raise ValueError(f"needs 4. Received: clients_per_round={clients_per_round}")
        return MeanPart()

    AGGREGATORS.register("test_factory_four", Aggregator(compiled=factory))
    try:
        assert AGGREGATORS.get("test_factory_four").fewest_clients({}) == (
            4, "the fewest clients_per_round its compiled form accepts")
        assert isinstance(build_part("test_factory_four", clients_per_round=4, seed=0, options={}), MeanPart)
    finally:
        AGGREGATORS.unregister("test_factory_four")


AGGREGATORS.register("test_needs_three", Aggregator(compiled=lambda clients_per_round, seed: MeanPart(),
                                                    min_clients=3, min_clients_rule="a rule of its own"))
