"""Consistency models on a real ParameterServerStrategy + ClusterCoordinator.

The policy rules are checked directly; training runs in a subprocess, because connecting to
an in-process parameter-server cluster turns this process's eager context into a cluster
context for good, and the rest of the suite shares the process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tensorfleet.compat import distribute as tf_internals
from tensorfleet.strategies.staleness import Consistency, StalenessPolicy, install, installed_gate, resolve_staleness
from tensorfleet.testing.staleness_run import StalenessScheduler
from tests.conftest import keras2_env


def test_staleness_option_maps_to_ssp_and_asp():
    assert resolve_staleness(0) == StalenessPolicy(0) and resolve_staleness(0).kind is Consistency.SSP
    assert resolve_staleness(0).label == "SSP k=0"
    assert resolve_staleness(3).kind is Consistency.SSP and resolve_staleness(3).label == "SSP k=3"
    assert resolve_staleness(None).kind is Consistency.ASP
    assert resolve_staleness("none") == resolve_staleness("ASP") == StalenessPolicy(None)
    assert resolve_staleness("8") == StalenessPolicy(8)
    assert [kind.value for kind in Consistency] == ["ssp", "asp"]  # nothing claims to be BSP


def test_bsp_is_refused_because_no_mode_aggregates_the_updates_of_a_clock():
    with pytest.raises(ValueError) as info:
        resolve_staleness("bsp")
    message = str(info.value)
    assert message.startswith("staleness='bsp' is not offered: the parameter server applies each worker's update")
    assert "staleness=0 keeps the workers' clocks in lockstep (SSP k=0)" in message
    assert "multi_worker_mirrored" in message


def test_may_start_enforces_at_most_k_steps_ahead_of_the_slowest():
    lockstep, ssp, asp = StalenessPolicy(0), StalenessPolicy(2), StalenessPolicy(None)
    assert lockstep.may_start([4, 4], 0) and not lockstep.may_start([5, 4], 0) and lockstep.may_start([5, 4], 1)
    assert ssp.may_start([6, 4, 5], 0) and not ssp.may_start([7, 4, 5], 0)
    assert asp.may_start([1000, 0], 0)


@pytest.mark.parametrize(
    "value,error,message",
    [
        (-1, ValueError, "staleness must be an integer k >= 0 (SSP: at most k steps ahead of the slowest worker) "
                         "or None (ASP). Received: staleness=-1"),
        ("sometimes", ValueError, "Received: staleness='sometimes'"),
        (1.5, TypeError, "Received: staleness=1.5 of type float"),
        (True, TypeError, "Received: staleness=True of type bool"),
    ],
)
def test_bad_staleness_raises_one_clear_error(value, error, message):
    with pytest.raises(error) as info:
        resolve_staleness(value)
    assert message in str(info.value)


def test_attach_rejects_a_strategy_without_a_coordinator_and_a_bad_staleness_first():
    from tensorfleet.strategies.staleness import attach

    with pytest.raises(TypeError, match="applies to a tf.distribute.experimental.ParameterServerStrategy. "
                                        "Received: MirroredStrategy"):
        attach(type("MirroredStrategy", (), {})(), 2)
    with pytest.raises(ValueError, match="Received: staleness=-3"):
        attach(type("MirroredStrategy", (), {})(), -3)


def test_scheduler_rejects_something_that_is_not_a_coordinator():
    with pytest.raises(TypeError, match="must be a tf.distribute.experimental.coordinator.ClusterCoordinator. "
                                        "Received: MirroredStrategy"):
        StalenessScheduler(type("MirroredStrategy", (), {})(), 0)


# --------------------------------------------------------------------------- the gate on TensorFlow's queue
# The gate wraps a ClusterCoordinator's closure queue. These tests drive TensorFlow's own
# _CoordinatedClosureQueue with worker threads that behave as the coordinator's do (take a step,
# then report it finished or put it back), without a cluster.


class _Step:
    """What the queue needs of a closure."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._output_remote_value_ref = None

    def mark_cancelled(self) -> None:
        pass


class _FakeCoordinator:
    def __init__(self, workers: int) -> None:
        self._cluster = type("Cluster", (), {})()
        self._cluster.closure_queue = tf_internals.new_closure_queue()
        self._cluster.workers = list(range(workers))
        self._cluster.resource_cancellation_mgr = None

    def join(self) -> None:
        self._cluster.closure_queue.wait()


def _worker(queue, w: int, taken: list, release: threading.Event, fail_first: bool = False) -> None:
    """A coordinator worker thread: takes closures (its own tagged work first), finishes them after
    ``release`` (or puts its first step back, as after a failure)."""
    failed = False
    while True:
        closure = queue.get(tag=w)
        if closure is None or getattr(closure, "name", None) == "stop":
            return
        if not isinstance(closure, _Step):  # the gate's no-op for this worker
            continue
        taken.append((w, closure.name))
        if closure.tag is not None:  # the worker's own work (a dataset, an iterator): no step
            continue
        release.wait(10)
        if fail_first and not failed:
            failed = True
            queue.put_back(closure)
            # "Recovering": back only once another worker took the step this one put back.
            assert _wait_for(lambda: any(v != w and name == closure.name for v, name in taken))
            continue
        queue.mark_finished()


def _wait_for(state, timeout: float = 10.0) -> bool:
    """Waits until ``state()`` holds (a state the threads make observable), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not state():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _run_workers(coordinator, n: int, release: threading.Event, fail_first: int | None = None):
    queue = tf_internals.coordinator_cluster(coordinator).closure_queue
    taken: list = []
    threads = [threading.Thread(target=_worker, args=(queue, w, taken, release, w == fail_first), daemon=True)
               for w in range(n)]
    for thread in threads:
        thread.start()
    return queue, taken, threads


def _stop(queue, threads) -> None:
    for w in range(len(threads)):
        stop = _Step("stop")
        queue.put(stop, tag=w)
    for thread in threads:
        thread.join(10)
    queue.stop()  # and its watchdog thread


def test_gate_holds_a_worker_back_until_the_slowest_catches_up():
    coordinator = _FakeCoordinator(2)
    gate = install(coordinator, 0)
    release = threading.Event()
    release.set()
    # Worker 1 only starts after worker 0 was given the chance to run ahead.
    queue = tf_internals.coordinator_cluster(coordinator).closure_queue
    taken: list = []
    t0 = threading.Thread(target=_worker, args=(queue, 0, taken, release), daemon=True)
    t0.start()
    for i in range(6):
        queue.put(_Step(f"s{i}"))
    assert _wait_for(lambda: gate.held_back == 1)  # worker 0 ran s0 and waits at the gate
    assert taken == [(0, "s0")] and gate.clocks == [1, 0]  # lockstep: worker 0 waits for worker 1
    t1 = threading.Thread(target=_worker, args=(queue, 1, taken, release), daemon=True)
    t1.start()
    assert queue.wait(timeout=10)
    assert gate.finished == [3, 3] and {gap for _, gap in gate.gaps} == {0}
    assert [r.clock for r in gate.records if r.worker == 1] == [0, 1, 2]
    _stop(queue, [t0, t1])


def test_a_step_given_to_the_queue_wakes_a_worker_that_may_take_it():
    # The queue wakes one waiting worker per step it is given; a worker held back by the policy
    # must not be the one that swallows that wake-up while the worker allowed to run sleeps on.
    coordinator = _FakeCoordinator(2)
    gate = install(coordinator, 0)
    release = threading.Event()
    release.set()
    queue = tf_internals.coordinator_cluster(coordinator).closure_queue
    taken: list = []
    t0 = threading.Thread(target=_worker, args=(queue, 0, taken, release), daemon=True)
    t0.start()
    queue.put(_Step("s0"))
    # worker 0 ran s0 and is now held back (lockstep), waiting first
    assert queue.wait(timeout=5) and _wait_for(lambda: gate.held_back == 1)
    t1 = threading.Thread(target=_worker, args=(queue, 1, taken, release), daemon=True)
    t1.start()
    assert _wait_for(lambda: tf_internals.workers_waiting_for_steps(queue) == 1)  # worker 1, after worker 0
    queue.put(_Step("s1"))
    assert queue.wait(timeout=5) and taken == [(0, "s0"), (1, "s1")]
    _stop(queue, [t0, t1])


def test_workers_already_waiting_for_work_when_the_gate_is_installed_are_gated_too():
    coordinator = _FakeCoordinator(2)
    release = threading.Event()
    release.set()
    queue, taken, threads = _run_workers(coordinator, 2, release)
    # both worker threads wait in the queue's own get(), before any gate
    assert _wait_for(lambda: tf_internals.workers_waiting_for_steps(queue) == 2)
    gate = install(coordinator, 0)
    for i in range(6):
        queue.put(_Step(f"s{i}"))
    assert queue.wait(timeout=10)
    assert len(gate.records) == 6 and sum(gate.finished) == 6 and len(gate.gaps) == 6
    _stop(queue, threads)


def test_a_held_back_worker_still_takes_its_own_tagged_work():
    coordinator = _FakeCoordinator(2)
    gate = install(coordinator, 0)
    release = threading.Event()
    release.set()
    queue = tf_internals.coordinator_cluster(coordinator).closure_queue
    taken: list = []
    t0 = threading.Thread(target=_worker, args=(queue, 0, taken, release), daemon=True)
    t0.start()
    queue.put(_Step("s0"))
    queue.put(_Step("s1"))
    assert _wait_for(lambda: gate.held_back == 1)  # worker 0 ran s0 and waits at the gate
    queue.put(_Step("rebuild iterator"), tag=0)  # held back by the policy, yet its own work passes
    assert _wait_for(lambda: len(taken) == 2 and gate.held_back == 1)  # ... and waits at the gate again
    assert taken == [(0, "s0"), (0, "rebuild iterator")]
    t1 = threading.Thread(target=_worker, args=(queue, 1, taken, release), daemon=True)
    t1.start()
    assert queue.wait(timeout=10)
    _stop(queue, [t0, t1])


def test_a_step_put_back_by_a_failed_worker_runs_again_and_the_others_go_on():
    coordinator = _FakeCoordinator(2)
    gate = install(coordinator, 0)
    release = threading.Event()
    release.set()
    queue, taken, threads = _run_workers(coordinator, 2, release, fail_first=1)
    for i in range(8):
        queue.put(_Step(f"s{i}"))
    assert queue.wait(timeout=10)
    steps = [name for _, name in taken]
    assert sorted(set(steps)) == [f"s{i}" for i in range(8)] and len(steps) == 9  # one step ran twice
    assert gate.retried == [1] and sum(gate.finished) == 8
    # Worker 1 was down and did not count as the slowest; back, it rejoined at worker 0's clock.
    assert max(gap for _, gap in gate.gaps) == 0
    _stop(queue, threads)


def test_uninstall_gives_the_queue_its_own_methods_back():
    coordinator = _FakeCoordinator(2)
    queue = tf_internals.coordinator_cluster(coordinator).closure_queue
    gate = install(coordinator, 1)
    assert installed_gate(coordinator) is gate and "get" in queue.__dict__
    assert install(coordinator, None) is None  # ASP: the coordinator's own behaviour
    assert installed_gate(coordinator) is None
    assert not {"get", "put", "mark_finished", "put_back", "mark_failed"} & set(queue.__dict__)
    queue.stop()


_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    from tensorfleet.compat import distribute as tf_internals
    from tensorfleet.models import build, datasets
    from tensorfleet.strategies.data_parallel import parameter_server
    from tensorfleet.strategies.servers import start_in_process_cluster
    from tensorfleet.strategies import staleness as consistency
    from tensorfleet.testing.staleness_run import train

    split = datasets.load_digits()
    strategy = parameter_server(cluster=start_in_process_cluster(workers=2, ps=1))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

    def dataset_fn(context):
        data = tf.data.Dataset.from_tensor_slices((split.x_train, split.y_train))
        return data.shuffle(1500).repeat().batch(32)

    out = {}
    for staleness in (0, 2, None):
        model, run = train(
            strategy, coordinator, model_fn=lambda: build("digits_mlp", input_dim=64),
            optimizer_fn=lambda: tf.keras.optimizers.SGD(0.05),
            dataset_fn=lambda c: dataset_fn(c).map(lambda x, y: (tf.reshape(x, [-1, 64]), y)),
            steps=24, staleness=staleness, straggler=1, straggler_delay=0.15, progress=False)
        out[run.policy.label] = {
            "per_worker": run.steps_per_worker(2),
            "gaps": [r.clock_gap for r in run.records],
            "applied": sorted(int(r.outputs["applied"]) for r in run.records),
            "lags": run.update_lags,
            "clocks": {w: [r.clock for r in run.records if r.worker == w] for w in (0, 1)},
        }
    # The same policies through Keras fit: install() puts the coordinator itself under a gate.
    fit_out = {}
    for staleness in (0, 1):
        gate = consistency.attach(strategy, staleness)  # the strategy's one coordinator
        with strategy.scope():
            model = build("digits_mlp", input_dim=64)
            model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                          loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        creator = tf.keras.utils.experimental.DatasetCreator(
            lambda c: dataset_fn(c).map(lambda x, y: (tf.reshape(x, [-1, 64]), y)))
        history = model.fit(creator, epochs=2, steps_per_epoch=10, verbose=0)
        fit_out[str(staleness)] = {"clocks": gate.clocks, "gaps": [g for _, g in gate.gaps],
                                   "loss": history.history["loss"]}
    fit_out["asp_gate"] = consistency.install(coordinator, None) is None
    fit_out["restored"] = not {"get", "put_back"} & set(
        tf_internals.coordinator_cluster(coordinator).closure_queue.__dict__)
    fit_out["schedule_untouched"] = "schedule" not in coordinator.__dict__ and "join" not in coordinator.__dict__
    out["fit"] = fit_out
    print("RESULT" + json.dumps(out))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ssp_and_asp_on_a_real_parameter_server_cluster():
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=230,
                          env=keras2_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    out = json.loads(line[len("RESULT"):])
    fit = out.pop("fit")
    for label, run in out.items():
        # Every update reached the parameter server exactly once, numbered 1..24.
        assert run["applied"] == list(range(1, 25)), label
        assert all(lag >= 0 for lag in run["lags"]), label
        for w in ("0", "1"):
            assert run["clocks"][w] == sorted(run["clocks"][w]) == list(range(len(run["clocks"][w])))
    lockstep, ssp, asp = out["SSP k=0"], out["SSP k=2"], out["ASP"]
    assert lockstep["per_worker"] == [12, 12] and set(lockstep["gaps"]) == {0}
    # In lockstep a worker only ever misses the other worker's update of the same clock: the
    # updates are applied one at a time, not aggregated: the straggler's gradient was computed
    # before the fast worker's update of the same clock landed (a lag of 1: this is not BSP).
    assert max(lockstep["lags"]) == 1
    assert max(ssp["gaps"]) == 2 and ssp["per_worker"][0] - ssp["per_worker"][1] <= 3
    # Without a bound the fast worker runs far ahead of the straggler (150 ms pause per step).
    assert max(asp["gaps"]) > 2 and asp["per_worker"][0] > asp["per_worker"][1] + 3
    assert max(asp["lags"]) >= 2
    # Keras fit under install(): 20 steps in all, k=0 in lockstep, k=1 at most 1 ahead.
    assert fit["0"]["clocks"] == [10, 10] and set(fit["0"]["gaps"]) == {0}
    assert sum(fit["1"]["clocks"]) == 20 and max(fit["1"]["gaps"]) <= 1
    assert fit["0"]["loss"][1] < fit["0"]["loss"][0]
    assert fit["asp_gate"] and fit["restored"] and fit["schedule_untouched"]
