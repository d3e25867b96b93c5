"""Keras 3 models in federated simulations on the compiled backend: the same rounds as the tf_keras twin.

The same model is written twice, with ``import keras`` (Keras 3) and ``import tf_keras``, from the same initial
weights; both run the same rounds (same seed: same sampling, shuffling, DP noise and masks), so their weights
must agree after them within float32 rounding (the two Kerases' kernels sum in other orders). Then the parts
that hold a Keras 3 model's own state: FedBN's BatchNormalization layers, Dropout, stragglers' partial work,
checkpoints and resume, federated evaluation; and the seed that makes a whole run, initial weights included.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

from tensorfleet.federated import Simulation, partition
from tensorfleet.federated.backends.compiled.scope import compiled_aggregators, compiled_algorithms
from tests.conftest import user_env

# float32 rounding of a few hundred steps of small weights (|w| ~ 1), summed in other orders by two Kerases.
TWIN_TOLERANCE = 2e-5
# Options that make each aggregator act on these clients without refusing them (krum needs n > 2f + 2).
AGGREGATOR_OPTIONS = {"dp_fixed": {"noise_multiplier": 0.1, "clip": 1.0}, "dp_adaptive": {"noise_multiplier": 0.1},
                      "compression": {"bits": 8, "sparsity": 0.5}, "krum": {"num_byzantine": 1}}


@pytest.fixture(scope="module")
def k3(keras3: Any) -> Any:
    return keras3


@pytest.fixture(scope="module")
def clients(digits_flat: Any) -> Any:
    return partition(digits_flat.x_train[:400], digits_flat.y_train[:400], num_clients=20, scheme="iid", seed=0)


def _build(keras: Any, dropout: float = 0.0) -> Any:
    layers = [keras.Input((64,)), keras.layers.Dense(16, activation="relu"), keras.layers.BatchNormalization()]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    return keras.Sequential([*layers, keras.layers.Dense(10)])


def _twins(k3: Any, clients: Any, algorithm: str, aggregator: str | None, **options: Any) -> list[list[np.ndarray]]:
    """The final weights (trainable, then non-trainable) of the Keras 3 model and of its tf_keras twin; checks
    that the rounds moved them from the initial weights (by far more than the twins' tolerance)."""
    import tf_keras

    start = _build(k3)
    initial = [np.array(w) for w in start.get_weights()]
    start_weights = [np.array(w) for w in [*start.trainable_weights, *start.non_trainable_weights]]
    out: list[list[np.ndarray]] = []
    for keras in (k3, tf_keras):
        def model_fn(keras: Any = keras) -> Any:
            model = _build(keras)
            model.set_weights(initial)
            return model

        sim = Simulation(model_fn, clients, algorithm, aggregator=aggregator, progress=False, seed=1,
                         aggregator_options=AGGREGATOR_OPTIONS.get(aggregator or "", {}), **options)
        sim.run()
        weights = sim.model_weights()
        out.append([np.asarray(w) for w in [*weights.trainable, *weights.non_trainable]])
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(out[0], start_weights))
    assert moved > 100 * TWIN_TOLERANCE, f"the rounds left the model where it started ({moved})"
    return out


def _assert_equal_twins(twins: list[list[np.ndarray]]) -> None:
    keras3_weights, keras2_weights = twins
    assert [w.shape for w in keras3_weights] == [w.shape for w in keras2_weights]
    for a, b in zip(keras3_weights, keras2_weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=TWIN_TOLERANCE)


@pytest.mark.parametrize("algorithm,options", [("fedavg", {}), ("fedprox", {"mu": 1.0}), ("fedadam", {}),
                                               ("fednova", {})])
@pytest.mark.parametrize("aggregator", [None, "secagg+"])
def test_keras3_and_tf_keras_twins_end_five_rounds_with_equal_weights(k3, clients, algorithm, options, aggregator):
    twins = _twins(k3, clients, algorithm, aggregator, algorithm_options=options, rounds=5, clients_per_round=6)
    _assert_equal_twins(twins)


@pytest.mark.parametrize("algorithm", [a for a in compiled_algorithms() if a not in ("fedavg", "fedprox", "fedadam",
                                                                                     "fednova")])
def test_every_other_algorithm_runs_a_keras3_model_as_its_tf_keras_twin(k3, clients, algorithm):
    _assert_equal_twins(_twins(k3, clients, algorithm, None, rounds=2, clients_per_round=5))


@pytest.mark.parametrize("aggregator", [a for a in compiled_aggregators() if a not in ("mean", "secagg+")])
def test_every_other_aggregator_runs_a_keras3_model_as_its_tf_keras_twin(k3, clients, aggregator):
    _assert_equal_twins(_twins(k3, clients, "fedavg", aggregator, rounds=2, clients_per_round=5))


def test_fedbn_and_partial_work_of_stragglers_keep_a_keras3_model_equal_to_its_twin(k3, clients):
    _assert_equal_twins(_twins(k3, clients, "fedavg", None, rounds=3, clients_per_round=6, non_trainable="per_client",
                               straggler_deadline=1.0, straggler_share=0.5, straggler_policy="partial"))


def test_a_keras3_model_resumes_from_its_checkpoint_as_the_uninterrupted_run_and_evaluates_clients(k3, clients,
                                                                                                   digits_flat,
                                                                                                   tmp_path):
    def model_fn() -> Any:
        return _build(k3)

    test = (digits_flat.x_test, digits_flat.y_test)
    options = dict(rounds=4, clients_per_round=5, seed=2, progress=False, test_data=test, eval_clients=4,
                   checkpoint_every=1)
    whole = Simulation(model_fn, clients, "fedavg", out_dir=str(tmp_path / "whole"), **options)
    whole.run()
    first = Simulation(model_fn, clients, "fedavg", out_dir=str(tmp_path / "split"), **{**options, "rounds": 2})
    first.run()
    resumed = Simulation(model_fn, clients, "fedavg", out_dir=str(tmp_path / "split"), **options)
    history = resumed.run()
    assert history.column("round") == [1, 2, 3, 4]
    for a, b in zip(whole.model_weights().trainable, resumed.model_weights().trainable):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)  # the same rounds in the same process
    last = history.rounds[-1]
    assert {"test_accuracy", "fed_eval_accuracy"} <= set(last)
    assert last == pytest.approx({**whole.history.rounds[-1], "seconds": last["seconds"]}, abs=1e-6)
    per_client = resumed.evaluate_clients({"a": test})
    assert per_client["a"]["test_accuracy"] == pytest.approx(last["test_accuracy"], abs=1e-9)


_SEEDED_RUN = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import keras, tf_keras
    import tensorfleet as tfl

    split = tfl.models.datasets.load_digits(flat=True)
    clients = tfl.federated.partition(split.x_train[:300], split.y_train[:300], num_clients=10, scheme="iid")
    for k in (keras, tf_keras):
        def model_fn(k=k):
            return k.Sequential([k.Input((64,)), k.layers.Dense(16, activation="relu"), k.layers.Dropout(0.2),
                                 k.layers.Dense(10)])
        sim = tfl.federated.Simulation(model_fn, clients, "fedavg", rounds=3, clients_per_round=4, seed=7,
                                       progress=False)
        sim.run()
        digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in sim.model_weights().trainable))
        print(k.__name__, digest.hexdigest())
""")


@pytest.mark.slow
def test_the_same_seed_gives_the_same_final_weights_bit_for_bit_in_either_keras(k3, tmp_path):
    script = tmp_path / "seeded.py"
    script.write_text(_SEEDED_RUN)
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=user_env(),
                              timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(dict(line.split() for line in done.stdout.splitlines() if line.startswith(("keras ", "tf_keras "))))
    assert set(runs[0]) == {"keras", "tf_keras"}
    assert runs[0] == runs[1]


def test_a_simulation_leaves_the_processs_random_state_as_it_was(k3, clients):
    import random

    import tensorflow as tf

    def draws() -> tuple[float, float, list[float]]:
        return random.random(), float(np.random.rand()), tf.random.uniform([3]).numpy().tolist()

    random.seed(11)
    np.random.seed(11)
    tf.random.set_seed(11)
    expected = draws()
    random.seed(11)
    np.random.seed(11)
    tf.random.set_seed(11)
    Simulation(lambda: _build(k3, dropout=0.2), clients, "fedavg", rounds=1, clients_per_round=3, seed=4,
               progress=False).run()
    assert draws() == expected
