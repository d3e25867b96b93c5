"""Multi-worker execution on real TFF C++ workers: equality, a worker killed mid-round, errors."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import signal
import threading
from typing import Any, Callable, Iterator

import numpy as np
import portpicker
import pytest

from tensorfleet.compat.keras import keras2
from tensorfleet.federated.backends.addresses import (
    AllWorkersLostError,
    WorkerAddress,
    WorkerUnreachableError,
    WorkerVersionError,
    parse_address,
    parse_addresses,
)
from tensorfleet.federated.backends.remote import DistributedContext, WorkerEvent

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

ROUNDS = 3
CLIENTS_PER_ROUND = 6


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"  # a zombie is dead, only not reaped yet
    except FileNotFoundError:
        return True


@pytest.fixture(scope="module")
def fedavg(digits: Any) -> dict[str, Any]:
    """A weighted FedAvg process on a linear digits model, with per-round client datasets."""
    import tensorflow as tf
    import tensorflow_federated as tff

    from tensorfleet.federated import partition

    clients = partition(digits.x_train, digits.y_train, num_clients=24, scheme="iid", seed=0)
    spec = collections.OrderedDict(x=tf.TensorSpec([None, 8, 8, 1], tf.float32), y=tf.TensorSpec([None], tf.int32))

    def model_fn() -> Any:
        model = tf_keras.Sequential([tf_keras.layers.Flatten(input_shape=(8, 8, 1)),
                                     tf_keras.layers.Dense(10, kernel_initializer="zeros")])
        return tff.learning.models.from_keras_model(
            model, input_spec=spec, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[tf_keras.metrics.SparseCategoricalAccuracy()])

    process = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))

    def data(r: int) -> list[Any]:
        ids = clients.client_ids[r * CLIENTS_PER_ROUND:(r + 1) * CLIENTS_PER_ROUND]
        return [clients.create_tf_dataset_for_client(c).shuffle(100, seed=r).batch(20) for c in ids]

    return {"process": process, "data": data}


def _run(fedavg: dict[str, Any], install: Any, before_round: Callable[[int], None] | None = None) -> list[np.ndarray]:
    process, data = fedavg["process"], fedavg["data"]
    with install:
        state = process.initialize()
        for r in range(ROUNDS):
            if before_round is not None:
                before_round(r)
            state = process.next(state, data(r)).state
        return [np.asarray(v) for v in process.get_model_weights(state).trainable]


@pytest.fixture()
def two_workers() -> Any:
    from tensorfleet.federated.backends.worker import Worker

    workers = [Worker(portpicker.pick_unused_port()).start() for _ in range(2)]
    pids = [w.pid for w in workers]
    try:
        yield workers
    finally:
        for w in workers:
            w.stop()
        assert all(_gone(pid) for pid in pids), "a worker_binary outlived its test"


@pytest.fixture(scope="module")
def reference(fedavg: dict[str, Any]) -> dict[str, list[np.ndarray]]:
    """Final weights after ROUNDS rounds: in one process (one worker) and on 2 workers."""
    from tensorfleet.federated.backends.tff import Runtime
    from tensorfleet.federated.backends.worker import Worker

    workers = [Worker(portpicker.pick_unused_port()).start() for _ in range(2)]
    pids = [w.pid for w in workers]
    try:
        single = _run(fedavg, Runtime(workers[0].process).installed())
        ctx = DistributedContext([w.address for w in workers])
        multi = _run(fedavg, ctx.installed())
        dispatched = {e.address for e in ctx.events if e.kind == "dispatch"}
        ctx.close()
    finally:
        for w in workers:
            w.stop()
    assert all(_gone(pid) for pid in pids)
    return {"single": single, "multi": multi, "dispatched": sorted(dispatched),
            "addresses": sorted(w.address for w in workers)}


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_workers_equal_one_process_within_1e6(reference: dict[str, Any]) -> None:
    assert reference["dispatched"] == reference["addresses"]  # both workers ran clients
    assert [w.shape for w in reference["multi"]] == [(64, 10), (10,)]
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(reference["single"], reference["multi"]))
    assert diff <= 1e-6
    assert float(np.abs(reference["multi"][0]).sum()) > 0.1  # it trained: the zero-initialised kernel moved


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_worker_killed_during_a_round_is_retried_and_model_equals_undisturbed(
        fedavg: dict[str, Any], reference: dict[str, Any], two_workers: list[Any]) -> None:
    victim = two_workers[1]
    ctx = DistributedContext([w.address for w in two_workers], lost_timeout=1.0)
    armed = {"round": -1, "killed_in": None}

    def kill_when_round_1_reaches_victim(event: WorkerEvent) -> None:
        if event.kind == "dispatch" and event.address == victim.address and armed["round"] == 1 \
                and armed["killed_in"] is None:
            armed["killed_in"] = armed["round"]
            os.kill(victim.pid, signal.SIGKILL)

    ctx.listeners.append(kill_when_round_1_reaches_victim)
    weights = _run(fedavg, ctx.installed(), before_round=lambda r: armed.update(round=r))
    ctx.close()

    assert armed["killed_in"] == 1
    assert not victim.running
    assert ctx.lost == [victim.address]
    assert ctx.alive == [two_workers[0].address]
    assert ctx.retries == 1
    kinds = [e.kind for e in ctx.events if e.kind in ("worker_lost", "retry")]
    assert kinds == ["worker_lost", "retry"]
    # The same parts of each round, merged the same way: equal to the undisturbed run, bit for bit.
    for got, want in zip(weights, reference["multi"]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_all_workers_lost_stops_with_an_error_naming_them(fedavg: dict[str, Any], two_workers: list[Any]) -> None:
    process, data = fedavg["process"], fedavg["data"]
    ctx = DistributedContext([w.address for w in two_workers], lost_timeout=1.0)
    with ctx.installed():
        state = process.initialize()
        state = process.next(state, data(0)).state
        for w in two_workers:
            os.kill(w.pid, signal.SIGKILL)
        with pytest.raises(AllWorkersLostError) as info:
            process.next(state, data(1))
    ctx.close()
    message = str(info.value)
    assert "All 2 TFF workers are lost" in message
    assert all(w.address in message for w in two_workers)
    # The completed round is kept: its state is a whole model.
    assert [np.asarray(v).shape for v in state.global_model_weights.trainable] == [(64, 10), (10,)]


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_address_where_nothing_listens_names_the_worker() -> None:
    port = portpicker.pick_unused_port()
    with pytest.raises(WorkerUnreachableError) as info:
        DistributedContext([f"127.0.0.1:{port}"], connect_timeout=1.0)
    assert f"No TFF worker answers at 127.0.0.1:{port}" in str(info.value)
    assert f"tensorfleet federated worker --port {port}" in str(info.value)
    assert info.value.address == f"127.0.0.1:{port}"


@contextlib.contextmanager
def _grpc_server(handlers: list[Any]) -> Iterator[int]:
    """A real gRPC server on 127.0.0.1 with ``handlers`` (none: every method is UNIMPLEMENTED); its port."""
    import grpc

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4), handlers=handlers)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(0)


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_grpc_server_that_is_not_this_tff_worker_is_refused() -> None:
    import tensorflow_federated as tff

    with _grpc_server([]) as port:
        with pytest.raises(WorkerVersionError) as info:
            DistributedContext([f"127.0.0.1:{port}"], connect_timeout=5.0)
    message = str(info.value)
    assert f"The server at 127.0.0.1:{port} answers gRPC but not as a tensorflow-federated {tff.__version__} worker" \
        in message
    assert "UNIMPLEMENTED" in message


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000", ":8471",
                                     "host:port", "::1:8471", "[::1]8471"])
def test_bad_address_is_refused_with_the_value(address: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_address(address)
    assert str(info.value) == ("Worker addresses are HOST:PORT with a port in [1, 65535], e.g. '127.0.0.1:8471'. "
                               f"Received: {address!r}")


def test_address_parsing() -> None:
    assert parse_address("127.0.0.1:8471") == WorkerAddress("127.0.0.1", 8471)
    assert parse_address("[::1]:8471").target == "[::1]:8471"
    assert [str(a) for a in parse_addresses("10.0.0.1:1, 10.0.0.2:2")] == ["10.0.0.1:1", "10.0.0.2:2"]
    with pytest.raises(TypeError, match="Received: 8471 of type int"):
        parse_address(8471)
    with pytest.raises(ValueError, match=r"workers must be a non-empty list .* Received: workers=\[\]"):
        parse_addresses([])
    with pytest.raises(ValueError, match="must not repeat an address. Received: '127.0.0.1:1' twice"):
        parse_addresses(["127.0.0.1:1", "127.0.0.1:1"])
    with pytest.raises(ValueError, match="num_subrounds must be a positive integer. Received: num_subrounds=0"):
        DistributedContext(["127.0.0.1:1"], num_subrounds=0, check=False)
    with pytest.raises(ValueError, match=r"round_timeout must be a finite number > 0. "
                                         r"Received: round_timeout=0"):
        DistributedContext(["127.0.0.1:1"], round_timeout=0, check=False)


def _linear_digits() -> Any:

    return tf_keras.Sequential([tf_keras.layers.Flatten(input_shape=(8, 8, 1)),
                                tf_keras.layers.Dense(10, kernel_initializer="zeros")])


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_simulation_with_workers_equals_simulation_in_one_process(two_workers: list[Any], digits: Any) -> None:
    from tensorfleet.federated import Simulation, partition
    from tensorfleet.federated.backends.tff import default_runtime, live_workers

    clients = partition(digits.x_train, digits.y_train, num_clients=20, scheme="iid", seed=1)
    options = dict(rounds=2, clients_per_round=6, seed=3, progress=False, backend="tff")
    local = Simulation(_linear_digits, clients, "fedavg", **options)
    local.run()
    spread = Simulation(_linear_digits, clients, "fedavg", workers=[w.address for w in two_workers], **options)
    history = spread.run()
    assert isinstance(spread.runtime, DistributedContext)
    assert spread.runtime.alive == [w.address for w in two_workers]
    assert {e.address for e in spread.runtime.events if e.kind == "dispatch"} == {w.address for w in two_workers}
    assert [r["participants"] for r in history.rounds] == [6, 6]
    for got, want in zip(spread.final_weights(), local.final_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert history.final("train_loss") == pytest.approx(local.history.final("train_loss"), abs=1e-6)
    # Afterwards TFF's default context is tensorfleet's local runtime again, not the workers.
    import tensorflow_federated as tff

    assert tff.framework.get_context_stack().current is default_runtime().context
    # The local run's own worker is stopped; only the two test workers still run.
    assert {id(w) for w in live_workers()} == {id(w.process) for w in two_workers}


def test_simulation_refuses_bad_worker_addresses(digits: Any) -> None:
    from tensorfleet.federated import Simulation, partition

    clients = partition(digits.x_train[:100], digits.y_train[:100], num_clients=4, scheme="iid", seed=0)
    with pytest.raises(ValueError, match=r"Received: 'localhost'$"):
        Simulation(_linear_digits, clients, workers=["localhost"], clients_per_round=2)


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_simulation_that_loses_a_worker_mid_run_keeps_every_round_and_ends_on_the_same_model(
        two_workers: list[Any], tmp_path: Any, digits: Any) -> None:
    from tensorfleet.federated import Simulation, partition

    clients = partition(digits.x_train, digits.y_train, num_clients=20, scheme="iid", seed=1)
    options = dict(rounds=3, clients_per_round=6, seed=5, progress=False, backend="tff")
    undisturbed = Simulation(_linear_digits, clients, "fedavg", **options)
    undisturbed.run()

    victim = two_workers[1]
    sim = Simulation(_linear_digits, clients, "fedavg", workers=[w.address for w in two_workers],
                     out_dir=tmp_path, checkpoint_every=1, tensorboard=False, **options)
    sim.build()
    sim.runtime.lost_timeout = 1.0
    killed_in_round: list[int] = []

    def kill_in_round_2(event: WorkerEvent) -> None:
        # Round 1 is done once its record exists; the next dispatch to the victim is round 2's.
        if event.kind == "dispatch" and event.address == victim.address and not killed_in_round \
                and len(sim.history.rounds) == 1:
            killed_in_round.append(len(sim.history.rounds) + 1)
            os.kill(victim.pid, signal.SIGKILL)

    sim.runtime.listeners.append(kill_in_round_2)
    history = sim.run()
    assert killed_in_round == [2]
    assert sim.runtime.lost == [victim.address] and sim.runtime.retries == 1
    assert [r["round"] for r in history.rounds] == [1, 2, 3]
    assert [r["participants"] for r in history.rounds] == [6, 6, 6]
    assert sim.load_checkpoint(sim.state)[1] == 3  # the last completed round is on disk
    for got, want in zip(sim.final_weights(), undisturbed.final_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_server_that_accepts_but_never_answers_is_refused_in_bounded_time() -> None:
    import grpc

    # A real gRPC server whose handler for every method waits longer than the check does.
    release = threading.Event()

    class Silent(grpc.GenericRpcHandler):
        def service(self, handler_call_details: Any) -> Any:
            def hang(request: Any, context: Any) -> bytes:
                release.wait(30)
                return b""

            return grpc.unary_unary_rpc_method_handler(hang)

    try:
        with _grpc_server([Silent()]) as port:
            with pytest.raises(WorkerVersionError) as info:
                DistributedContext([f"127.0.0.1:{port}"], connect_timeout=2.0)
    finally:
        release.set()
    assert str(info.value).startswith(f"The server at 127.0.0.1:{port} accepted a gRPC connection but did not answer "
                                      "a tensorflow-federated")
    assert "within 5 s" in str(info.value)


@pytest.mark.tff
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_frozen_worker_is_dropped_after_the_round_timeout_and_model_equals_undisturbed(
        fedavg: dict[str, Any], reference: dict[str, Any], two_workers: list[Any]) -> None:
    victim = two_workers[1]
    ctx = DistributedContext([w.address for w in two_workers], lost_timeout=2.0, round_timeout=4.0)
    armed = {"round": -1, "frozen": False}

    def freeze_in_round_1(event: WorkerEvent) -> None:
        if event.kind == "dispatch" and event.address == victim.address and armed["round"] == 1 \
                and not armed["frozen"]:
            armed["frozen"] = True
            os.kill(victim.pid, signal.SIGSTOP)  # alive, connected, silent

    ctx.listeners.append(freeze_in_round_1)
    try:
        weights = _run(fedavg, ctx.installed(), before_round=lambda r: armed.update(round=r))
        assert victim.running  # stopped, not dead: only the round timeout could notice it
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        ctx.close()
    assert armed["frozen"]
    assert ctx.lost == [victim.address] and ctx.retries == 1
    lost = [e for e in ctx.events if e.kind == "worker_lost"]
    assert lost[0].detail == "did not answer within 2 s after 4 s of a computation"
    for got, want in zip(weights, reference["multi"]):
        np.testing.assert_array_equal(got, want)
