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

import pytest

from tensorfleet.strategies.staleness import Consistency, StalenessPolicy, StalenessScheduler, resolve_staleness


def test_staleness_option_maps_to_bsp_ssp_and_asp():
    assert resolve_staleness(0) == StalenessPolicy(0) and resolve_staleness(0).kind is Consistency.BSP
    assert resolve_staleness(3).kind is Consistency.SSP and resolve_staleness(3).label == "SSP k=3"
    assert resolve_staleness(None).kind is Consistency.ASP
    assert resolve_staleness("none") == resolve_staleness("ASP") == StalenessPolicy(None)
    assert resolve_staleness("bsp") == StalenessPolicy(0)
    assert resolve_staleness("8") == StalenessPolicy(8)


def test_may_start_enforces_at_most_k_steps_ahead_of_the_slowest():
    bsp, ssp, asp = StalenessPolicy(0), StalenessPolicy(2), StalenessPolicy(None)
    assert bsp.may_start([4, 4], 0) and not bsp.may_start([5, 4], 0) and bsp.may_start([5, 4], 1)
    assert ssp.may_start([6, 4, 5], 0) and not ssp.may_start([7, 4, 5], 0)
    assert asp.may_start([1000, 0], 0)


@pytest.mark.parametrize(
    "value,error,message",
    [
        (-1, ValueError, "staleness must be an integer >= 0 (0 = BSP, k = SSP) or None (ASP). Received: staleness=-1"),
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


_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    from tensorfleet.models import build, datasets
    from tensorfleet.strategies.data_parallel import parameter_server
    from tensorfleet.strategies.servers import start_in_process_cluster
    from tensorfleet.strategies import staleness as consistency
    from tensorfleet.strategies.staleness_run import train

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
    fit_out["restored"] = "schedule" not in coordinator.__dict__
    out["fit"] = fit_out
    print("RESULT" + json.dumps(out))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bsp_ssp_asp_on_a_real_parameter_server_cluster():
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=230)
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
    bsp, ssp, asp = out["BSP"], out["SSP k=2"], out["ASP"]
    assert bsp["per_worker"] == [12, 12] and set(bsp["gaps"]) == {0}
    # Under BSP a worker only ever misses the other worker's update of the same clock.
    assert max(bsp["lags"]) <= 1
    assert max(ssp["gaps"]) == 2 and ssp["per_worker"][0] - ssp["per_worker"][1] <= 3
    # Without a bound the fast worker runs far ahead of the straggler (150 ms pause per step).
    assert max(asp["gaps"]) > 2 and asp["per_worker"][0] > asp["per_worker"][1] + 3
    assert max(asp["lags"]) >= 2
    # Keras fit under install(): 20 steps in all, BSP in lockstep, SSP k=1 at most 1 ahead.
    assert fit["0"]["clocks"] == [10, 10] and set(fit["0"]["gaps"]) == {0}
    assert sum(fit["1"]["clocks"]) == 20 and max(fit["1"]["gaps"]) <= 1
    assert fit["0"]["loss"][1] < fit["0"]["loss"][0]
    assert fit["asp_gate"] and fit["restored"]
