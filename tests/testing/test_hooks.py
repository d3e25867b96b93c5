"""tensorfleet.testing: its hooks reach the library's code where a job is made, for the block that sets them
and the thread that runs it only, and no public signature carries them."""

from __future__ import annotations

import inspect
import json
import threading
from dataclasses import fields

import numpy as np
import pytest

from tensorfleet import testing
from tensorfleet.cluster.contract import ENV_MIGRATION
from tensorfleet.cluster.launch_options import Recovery
from tensorfleet.cluster.migration import Placement, RunOptions, TaskOptions, migrate
from tensorfleet.cluster.processes import JobMode, LocalJob
from tensorfleet.strategies.tf_config import ClusterSpec
from tensorfleet.testing import Fault


def _job() -> LocalJob:
    spec = ClusterSpec.local(workers=2, ports=[1, 2])
    return LocalJob(spec=spec, mode=JobMode.COLLECTIVE, argv=[], env={}, log=None, stop_when=None)  # no process


def test_public_signatures_carry_no_hook() -> None:
    from tensorfleet.edge.decompose import decompose, plan_decomposition
    from tensorfleet.tuning.distributed import Supervision

    assert {f.name for f in fields(RunOptions)} & {"equal_shares", "input_delay", "slowdown"} == set()
    assert "faults" not in {f.name for f in fields(Recovery)} | {f.name for f in fields(Supervision)}
    assert "faults" not in inspect.signature(migrate).parameters
    for function in (plan_decomposition, decompose):
        assert "allow_growth" not in inspect.signature(function).parameters


def test_faults_reach_the_jobs_made_in_the_block_and_only_those() -> None:
    fault = Fault("worker:1", r"epoch 3 step 2", watch="worker:0")
    with testing.faults(fault):
        inside = _job()
        with testing.allow_growth():  # another hook nested: the faults stay
            assert testing.hooks.active().faults == (fault,) and testing.hooks.active().allow_growth
        assert not testing.hooks.active().allow_growth
    assert inside.faults == [fault]
    assert _job().faults == [] and testing.hooks.active() == testing.Hooks()


def test_a_block_in_one_thread_leaves_the_others_alone() -> None:
    entered, checked = threading.Event(), threading.Event()
    seen: list[tuple] = []

    def other() -> None:
        with testing.faults(Fault("worker:0", "x")):
            entered.set()
            checked.wait(30)
            seen.append(testing.hooks.active().faults)

    thread = threading.Thread(target=other)
    thread.start()
    assert entered.wait(30)
    assert testing.hooks.active().faults == ()  # the other thread's block is in force there, not here
    checked.set()
    thread.join(30)
    assert seen == [(Fault("worker:0", "x"),)]


def test_slowed_inputs_and_equal_shares_travel_in_the_task_options(tmp_path) -> None:
    run, to = RunOptions(epochs=2, global_batch_size=8), Placement("parameter_server", workers=2, ps=1)
    with testing.slow_inputs(0.004, slowdown=(1, 4)), testing.equal_shares():
        options = TaskOptions.of(run, out_dir=tmp_path, to=to, resume=False)
    assert (options.equal_shares, options.input_delay, options.slowdown) == (True, 0.004, (1.0, 4.0))
    record = json.loads(options.to_env()[ENV_MIGRATION])
    assert (record["equal_shares"], record["input_delay"], record["slowdown"]) == (True, 0.004, [1.0, 4.0])
    assert TaskOptions.from_env(options.to_env()) == options and options.run() == run
    plain = TaskOptions.of(run, out_dir=tmp_path, to=to, resume=False)
    assert (plain.equal_shares, plain.input_delay, plain.slowdown) == (False, 0.0, None)


@pytest.mark.parametrize(("make", "error", "message"), [
    (lambda: testing.faults(Fault("worker1", "x")), ValueError,
     "A task is named 'role:index', e.g. 'worker:1'. Received: 'worker1'"),
    (lambda: testing.faults(Fault("tuner:1", "x", watch="boss:0")), ValueError,
     "A task is named 'role:index', e.g. 'worker:1'. Received: 'boss:0'"),
    (lambda: testing.faults([Fault("worker:1", "x")]), TypeError,
     "faults takes Fault objects. Received: [Fault(task='worker:1', when='x', signal=<Signals.SIGKILL: 9>, "
     "attempt=0, watch=None, delay=0.0)]"),
    (lambda: testing.slow_inputs(-0.1), ValueError, "delay must be a finite number >= 0. Received: delay=-0.1"),
    (lambda: testing.slow_inputs(0.01, slowdown=(1.0, 0)), ValueError,
     "slowdown[1] must be a finite number > 0. Received: slowdown[1]=0"),
])
def test_bad_hook_settings_are_clear_errors(make, error, message) -> None:
    with pytest.raises(error) as info, make():
        pass
    assert str(info.value) == message
    assert testing.hooks.active() == testing.Hooks()


def test_allow_growth_factors_a_layer_that_would_not_shrink() -> None:
    from tensorfleet import edge
    from tensorfleet.compat.keras import keras2

    keras = keras2()
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(6, name="square")])
    alone = edge.plan_decomposition(model, "svd", rank=6)
    assert alone.layers[0].reason == "would not shrink: 42 -> 78 parameters at rank 6" and not alone.decomposed
    with testing.allow_growth():
        grown = edge.decompose(model, "svd", rank=6)
    x = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32)
    assert grown.count_params() == 78
    np.testing.assert_allclose(grown(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
