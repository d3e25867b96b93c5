"""The compiled backend across processes (current track): its lanes on TensorFlow worker processes.

A process that joins TensorFlow workers stays joined, so each scenario runs in a child process of its own
(as a user's script would), which starts its workers on 127.0.0.1 and stops them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import portpicker
import pytest

from tests.conftest import user_env

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    import numpy as np
    import portpicker
    import keras
    import tensorfleet as tfl
    from tensorfleet.federated.backends.addresses import AllWorkersLostError
    from tensorfleet.federated.backends.compiled.workers import TfWorker, connect

    split = tfl.models.datasets.load_digits(flat=True)
    clients = tfl.federated.partition(split.x_train[:600], split.y_train[:600], num_clients=12, scheme="iid")

    def model_fn():
        return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                 keras.layers.BatchNormalization(), keras.layers.Dense(10)])

    opts = dict(rounds=4, clients_per_round=6, seed=3, progress=False, backend="compiled",
                test_data=(split.x_test, split.y_test), eval_clients=2)
    local = tfl.federated.Simulation(model_fn, clients, "fedprox", algorithm_options={"mu": 0.5}, **opts)
    local.run()
    workers = [TfWorker(portpicker.pick_unused_port()).start() for _ in range(2)]
    out = {}
    try:
        addresses = [w.address for w in workers]
        spread = tfl.federated.Simulation(model_fn, clients, "fedprox", algorithm_options={"mu": 0.5},
                                          workers=addresses, **opts)
        # Worker 1 is killed once round 2 is done: rounds 3 and 4 run on worker 0 alone.
        spread.round_listeners.append(lambda r: r["round"] == 2 and os.kill(workers[1].pid, signal.SIGKILL))
        spread.run()
        engine = spread.rounds.engine
        out["devices"] = sorted({str(v.device) for lane in engine._lanes for v in lane[1]})
        out["lost"] = [addresses.index(a) for a in spread.rounds.workers.lost]
        out["rounds"] = spread.history.column("round")
        pairs = zip([*local.model_weights().trainable, *local.model_weights().non_trainable],
                    [*spread.model_weights().trainable, *spread.model_weights().non_trainable])
        out["diff"] = max(float(np.max(np.abs(a - b))) for a, b in pairs)
        out["accuracy"] = [local.history.final("test_accuracy"), spread.history.final("test_accuracy")]
        try:
            connect(["127.0.0.1:1"])
        except ValueError as error:
            out["second_set"] = str(error)
        # The last worker killed after round 1 of a new run: no worker is left for round 2.
        last = tfl.federated.Simulation(model_fn, clients, "fedavg", workers=addresses, **opts)
        last.round_listeners.append(lambda r: r["round"] == 1 and os.kill(workers[0].pid, signal.SIGKILL))
        try:
            last.run()
        except AllWorkersLostError as error:
            out["all_lost"] = str(error)
            out["kept"] = last.history.column("round")
    finally:
        for w in workers:
            w.stop()
    print("RESULT " + json.dumps(out))
""")


def run_script(tmp_path: Any, text: str, timeout: float) -> dict[str, Any]:
    """Runs ``text`` as a user's script in a child process of its own; returns the dict it prints."""
    script = tmp_path / "scenario.py"
    script.write_text(text)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=user_env(TF_CPP_MIN_LOG_LEVEL="3"))
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(lines[-1][7:])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_rounds_on_two_tensorflow_workers_equal_one_process_and_survive_a_lost_worker(tmp_path):
    out = run_script(tmp_path, SCRIPT, timeout=360)
    assert out["devices"] == ["/job:worker/replica:0/task:0/device:CPU:0"]  # the lane left after the loss
    assert out["lost"] == [1] and out["rounds"] == [1, 2, 3, 4]
    assert out["diff"] < 1e-5  # float32 sums of the same updates, in another order
    assert out["accuracy"][1] == pytest.approx(out["accuracy"][0], abs=1e-3)
    assert out["second_set"].startswith("This process already joined the workers ")
    assert out["all_lost"].startswith("Every worker of the compiled backend is lost")
    assert out["kept"] == [1]


FROZEN = textwrap.dedent("""
    import json, os, signal
    import numpy as np
    import portpicker
    import keras
    import tensorfleet as tfl
    from tensorfleet.federated.backends.addresses import AllWorkersLostError
    from tensorfleet.federated.backends.compiled.workers import TfWorker, connect

    split = tfl.models.datasets.load_digits(flat=True)
    clients = tfl.federated.partition(split.x_train[:600], split.y_train[:600], num_clients=12, scheme="iid")

    def model_fn():
        return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                 keras.layers.Dense(10)])

    opts = dict(rounds=3, clients_per_round=6, seed=3, progress=False, backend="compiled")
    local = tfl.federated.Simulation(model_fn, clients, "fedavg", server_optimizer="adam", **opts)
    local.run()
    workers = [TfWorker(portpicker.pick_unused_port()).start() for _ in range(2)]
    out = {}
    try:
        addresses = [w.address for w in workers]
        connect(addresses).lost_timeout = 2.0  # (5 s by default) the deadline of the status call
        spread = tfl.federated.Simulation(model_fn, clients, "fedavg", server_optimizer="adam", workers=addresses,
                                          round_timeout=2.0, **opts)
        # Worker 1 is frozen once round 1 is done: round 2 waits on it, is abandoned and run again on worker 0.
        spread.round_listeners.append(lambda r: r["round"] == 1 and os.kill(workers[1].pid, signal.SIGSTOP))
        spread.run()
        rounds = spread.rounds
        out["lost"] = [addresses.index(a) for a in rounds.workers.lost]
        out["rounds"] = spread.history.column("round")
        pairs = zip(local.rounds.state_leaves(), rounds.state_leaves())
        out["diff"] = max(float(np.max(np.abs(a - b))) for a, b in pairs)
        kept = rounds.state_leaves()
        os.kill(workers[1].pid, signal.SIGCONT)  # the abandoned call of round 2 now ends
        abandoned = rounds.workers.abandoned
        for thread in abandoned:
            thread.join(60)
        out["abandoned"] = [len(abandoned), sum(t.is_alive() for t in abandoned)]
        out["unchanged"] = all(np.array_equal(a, b) for a, b in zip(kept, rounds.state_leaves()))
        # The last worker frozen after round 1 of a new run: one error, the state of round 1 kept.
        last = tfl.federated.Simulation(model_fn, clients, "fedavg", workers=addresses, round_timeout=2.0, **opts)
        last.round_listeners.append(lambda r: r["round"] == 1 and os.kill(workers[0].pid, signal.SIGSTOP))
        seen = {}
        last.round_listeners.append(lambda r: seen.update(leaves=last.rounds.state_leaves()))
        try:
            last.run()
        except AllWorkersLostError as error:
            out["all_lost"] = str(error)
            out["kept"] = last.history.column("round")
            out["state_of_round_1"] = all(np.array_equal(a, b) for a, b in zip(seen["leaves"],
                                                                               last.rounds.state_leaves()))
    finally:
        for w in workers:
            os.kill(w.pid, signal.SIGCONT)
            w.stop()
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_frozen_worker_is_dropped_after_round_timeout_and_its_late_call_changes_nothing(tmp_path):
    out = run_script(tmp_path, FROZEN, timeout=240)
    assert out["lost"] == [1] and out["rounds"] == [1, 2, 3]
    assert out["diff"] < 1e-5  # weights and Adam's state: float32 sums of the same updates, in another order
    assert out["abandoned"] == [1, 0]  # round 2's first call ended once the worker thawed...
    assert out["unchanged"]  # ...and changed nothing
    assert out["all_lost"].startswith("Every worker of the compiled backend is lost")
    assert out["kept"] == [1] and out["state_of_round_1"]


def test_a_worker_that_does_not_answer_is_named_with_how_to_start_one():
    from tensorfleet.federated.backends.addresses import WorkerUnreachableError
    from tensorfleet.federated.backends.compiled.workers import connect

    port = portpicker.pick_unused_port()
    with pytest.raises(WorkerUnreachableError, match=rf"^No TensorFlow worker answers at 127\.0\.0\.1:{port}\. Start "
                                                     rf"one with `tensorfleet federated worker --port {port}`"):
        connect([f"127.0.0.1:{port}"])


def test_the_tensorflow_worker_refuses_options_of_tffs(capsys):
    from tensorfleet.cli.main import main

    assert main(["federated", "worker", "--port", "1", "--runtime", "tensorflow", "--max-concurrent", "4"]) == 2
    assert capsys.readouterr().err.startswith("error: --max-concurrent applies to TFF's worker (--runtime tff). "
                                              "Received: --max-concurrent 4 with --runtime tensorflow")
