"""Where rounds run by default: ``auto``, which picks compiled where it gives TFF's result and says so.

Also the correctness points that decide the pick: layers that mix a batch's rows at inference go to
TFF (compiled refuses them before the first round; BatchNormalization runs on compiled), and DP with noise on draws
TFF's noise distribution and reports the same epsilon on both backends (tff track). Where TFF is missing (the current
track), asking for it is one error that names the tff track.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tensorfleet import models
from tensorfleet.compat.keras import keras2
from tensorfleet.compat.tff import TffUnavailableError, tff_available
from tensorfleet.federated import Simulation, SimulationConfig, partition
from tensorfleet.federated.backends import Backend

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

# What tests that TFF is asked for where it is missing need: a track without it (the current one).
without_tff = pytest.mark.skipif(tff_available(), reason="tensorflow-federated imports here (the tff track)")


@pytest.fixture(scope="module")
def clients(digits_flat):
    return partition(digits_flat.x_train[:400], digits_flat.y_train[:400], num_clients=10, scheme="iid", seed=0)


def _with_batch_norm():

    return tf_keras.Sequential([tf_keras.layers.Dense(16, input_shape=(64,)),
                                tf_keras.layers.BatchNormalization(name="bn"), tf_keras.layers.Dense(10)])


def test_the_default_backend_is_auto_in_the_config_and_the_simulation(clients):
    assert SimulationConfig().backend is Backend.AUTO
    sim = Simulation(lambda: models.build("digits_mlp", hidden=8), clients, rounds=1, clients_per_round=4)
    assert sim.requested_backend is Backend.AUTO and sim.config.backend is Backend.AUTO  # decided when built


def test_auto_runs_compiled_and_says_so_in_the_header_and_the_metadata(clients, tmp_path, capsys):
    sim = Simulation(lambda: models.build("digits_mlp", hidden=8), clients, "fedprox", rounds=2, clients_per_round=4,
                     out_dir=tmp_path, tensorboard=False)
    sim.run()
    assert sim.header() == "fedprox on compiled (chosen by auto)"
    assert "fedprox on compiled (chosen by auto)" in capsys.readouterr().err  # the progress bar's title
    assert sim.runtime is None and sim.rounds.engine is not None  # no TFF worker started
    # 'auto' decided beside the user's config, which stays as given
    assert sim.backend is Backend.COMPILED and sim.config.backend is Backend.AUTO and sim.sampler.config is sim.config
    saved = json.loads((tmp_path / "metrics.json").read_text())["config"]
    assert (saved["backend"], saved["backend_requested"]) == ("compiled", "auto")
    assert saved["proximal_gradient"] == "mu * (w - w_server)"


@pytest.mark.tff
def test_workers_are_tffs_where_tff_imports():
    assert SimulationConfig(workers="127.0.0.1:8000").backend is Backend.TFF


@without_tff
def test_workers_are_tensorflows_where_tff_does_not_import():
    config = SimulationConfig(workers="127.0.0.1:8000,127.0.0.1:8001")
    assert config.backend is Backend.COMPILED and config.workers == ("127.0.0.1:8000", "127.0.0.1:8001")


@without_tff
@pytest.mark.parametrize("options,asked", [
    ({"backend": "tff"}, "backend='tff'"),
    ({"backend": "tff", "workers": "127.0.0.1:8000"}, "backend='tff' with workers="),
])
def test_asking_for_tff_where_it_is_missing_is_one_error_naming_the_tff_track(clients, options, asked):
    with pytest.raises(TffUnavailableError) as info:
        Simulation(lambda: models.build("digits_mlp", hidden=8), clients, rounds=1, clients_per_round=4, **options)
    assert str(info.value) == (
        f"{asked} runs rounds on tensorflow-federated, which cannot be imported here. tensorflow-federated pins "
        "TensorFlow 2.14 and Python 3.11: use the tff track (`make install-tff`, then `.venv-tff/bin/python`), or "
        "the compiled backend (backend='compiled'), which needs no TFF.")


def _centering():
    import tensorflow as tf

    # Subtracts the batch mean at inference too: a row's output depends on the other rows.
    return tf_keras.Sequential([tf_keras.layers.Dense(10, input_shape=(64,)),
                                tf_keras.layers.Lambda(lambda t: t - tf.reduce_mean(t, axis=0))])


@without_tff
def test_auto_with_a_model_only_tff_runs_is_one_error_where_tff_is_missing(clients):
    sim = Simulation(_centering, clients, rounds=1, clients_per_round=4, progress=False)
    with pytest.raises(TffUnavailableError,
                       match=r"^backend='auto' for what the compiled backend does not run \(a model "
                                                  r"with batch-dependent layers \(a layer of the model .*use the tff "
                                                  r"track"):
        sim.run()
    assert sim.history.rounds == [] and sim.rounds is None


def test_auto_runs_a_batch_normalization_model_on_compiled(clients, capsys):
    sim = Simulation(_with_batch_norm, clients, rounds=1, clients_per_round=4)
    history = sim.run()
    assert sim.header() == "fedavg on compiled (chosen by auto)"
    assert "fedavg on compiled (chosen by auto)" in capsys.readouterr().err
    assert (history.config["backend"], history.config["backend_requested"]) == ("compiled", "auto")
    assert [r["round"] for r in history.rounds] == [1] and np.isfinite(history.rounds[0]["train_loss"])


@pytest.mark.tff
def test_auto_runs_a_batch_dependent_model_on_tff_and_compiled_refuses_it_before_the_first_round(clients, capsys):
    sim = Simulation(_centering, clients, rounds=1, clients_per_round=4)
    history = sim.run()
    assert sim.header() == "fedavg on tff (chosen by auto)"
    assert "fedavg on tff (chosen by auto)" in capsys.readouterr().err
    assert (history.config["backend"], history.config["backend_requested"]) == ("tff", "auto")
    assert [r["round"] for r in history.rounds] == [1] and np.isfinite(history.rounds[0]["train_loss"])

    refused = Simulation(_centering, clients, rounds=1, clients_per_round=4, backend="compiled", progress=False)
    with pytest.raises(ValueError, match=r"Received: a model with batch-dependent layers \(a layer of the model"):
        refused.run()
    assert refused.history.rounds == [] and refused.rounds is None and refused.runtime is None


@pytest.mark.tff
def test_dp_noise_on_both_backends_has_the_same_distribution_and_epsilon(clients):
    from tensorfleet.federated.aggregators.dp import epsilon

    # One round of 5 clients, clip 1, noise multiplier 1: the global model moves by the clipped mean
    # plus Gaussian noise of stddev 1 * 1 / 5 on each of its 38,410 weights (server SGD, lr 1).
    def first_round(backend, noise_multiplier):
        sim = Simulation(lambda: models.build("digits_mlp", hidden=512), clients, "fedavg", rounds=1,
                         clients_per_round=5, seed=3, progress=False, backend=backend, aggregator="dp_fixed",
                         aggregator_options={"noise_multiplier": noise_multiplier, "clip": 1.0})
        history = sim.run()
        assert sim.backend.value == backend and sim.config.backend.value == backend
        return np.concatenate([w.ravel() for w in sim.final_weights()]), history.rounds[0].get("epsilon")

    clean, eps_clean = first_round("compiled", 0.0)
    noise = {}
    eps = {}
    for backend in ("tff", "compiled"):
        noised, eps[backend] = first_round(backend, 1.0)
        noise[backend] = noised - clean
    expected_std = 1.0 * 1.0 / 5
    assert clean.size == 38_410 and eps_clean == float("inf")
    for draw in noise.values():
        assert abs(draw.mean()) < 0.02 * expected_std
        assert draw.std() == pytest.approx(expected_std, rel=0.02)
    assert noise["compiled"].std() == pytest.approx(noise["tff"].std(), rel=0.02)
    assert not np.allclose(noise["compiled"], noise["tff"])  # drawn, not copied
    assert eps["tff"] == eps["compiled"] == epsilon(noise_multiplier=1.0, clients_per_round=5, num_clients=10,
                                                    rounds=1, delta=1e-5)


@pytest.mark.tff
def test_auto_resumes_a_tff_checkpoint_on_tff_and_starts_afresh_on_compiled(clients, tmp_path):
    def sim(rounds, **options):
        return Simulation(lambda: models.build("digits_mlp", hidden=8), clients, rounds=rounds, clients_per_round=4,
                          out_dir=tmp_path, checkpoint_every=1, tensorboard=False, progress=False, **options)

    sim(1, backend="tff").run()  # a run of the tff backend, as the default was
    resumed = sim(2)
    history = resumed.run()
    assert resumed.header() == "fedavg on tff (chosen by auto)"
    assert [r["round"] for r in history.rounds] == [1, 2] and history.config["backend"] == "tff"
    fresh = sim(1, resume=False)
    assert [r["round"] for r in fresh.run().rounds] == [1] and fresh.header() == "fedavg on compiled (chosen by auto)"
