"""The compiled backend gives TFF's model after the same rounds."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow_federated")

from tensorfleet import models  # noqa: E402
from tensorfleet.federated import Simulation, partition  # noqa: E402


def test_compiled_backend_equals_tff_after_the_same_rounds(digits_flat):
    clients = partition(digits_flat.x_train, digits_flat.y_train, num_clients=20, scheme="dirichlet:0.5", seed=1)
    runs = {}
    for backend in ("tff", "compiled"):
        sim = Simulation(lambda: models.build("digits_mlp", hidden=16), clients, "fedadam", rounds=3,
                         clients_per_round=5, local_epochs=2, batch_size=8, dropout=0.2, seed=4, progress=False,
                         backend=backend, test_data=(digits_flat.x_test, digits_flat.y_test))
        history = sim.run()
        runs[backend] = (sim.final_weights(), history.rounds)
    (w_tff, h_tff), (w_fast, h_fast) = runs["tff"], runs["compiled"]
    assert len(w_tff) == len(w_fast) == 4
    for a, b in zip(w_tff, w_fast):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    for a, b in zip(h_tff, h_fast):
        assert a["num_examples"] == b["num_examples"] and a["participants"] == b["participants"]
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5)
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=1e-9)


def test_compiled_backend_refuses_what_it_does_not_run(digits_flat):
    clients = partition(digits_flat.x_train, digits_flat.y_train, num_clients=10, seed=0)
    with pytest.raises(ValueError, match=r"backend='compiled' runs fedavg, fedavgm, fedadam, fedyogi, fedadagrad with "
                                         r"the mean aggregator on partition\(\) client data. Received: "
                                         r"algorithm='fedprox'"):
        Simulation(lambda: models.build("digits_mlp"), clients, "fedprox", backend="compiled")
    with pytest.raises(ValueError, match=r"backend must be one of 'tff', 'compiled'. Received: backend='gpu'"):
        Simulation(lambda: models.build("digits_mlp"), clients, backend="gpu")
    with pytest.raises(ValueError, match=r"workers= runs rounds on TFF workers; backend='compiled' runs them in this "
                                         r"process. Received: backend='compiled', workers=\['127.0.0.1:8000'\]"):
        Simulation(lambda: models.build("digits_mlp"), clients, backend="compiled", workers=["127.0.0.1:8000"])


def test_compiled_backend_resumes_from_its_checkpoint_to_the_straight_model(digits_flat, tmp_path):
    clients = partition(digits_flat.x_train, digits_flat.y_train, num_clients=10, scheme="iid", seed=2)

    def sim(rounds, out):
        return Simulation(lambda: models.build("digits_mlp", hidden=8), clients, "fedavgm", rounds=rounds,
                          clients_per_round=4, seed=5, progress=False, backend="compiled", out_dir=out,
                          checkpoint_every=1, tensorboard=False)

    straight = sim(4, tmp_path / "straight")
    straight.run()
    sim(2, tmp_path / "split").run()
    resumed = sim(4, tmp_path / "split")
    history = resumed.run()
    assert [r["round"] for r in history.rounds] == [1, 2, 3, 4]
    for a, b in zip(straight.final_weights(), resumed.final_weights()):
        np.testing.assert_array_equal(a, b)
