"""Heterogeneous workers: per-replica batches in proportion to measured speed, the same update."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tensorfleet import testing
from tensorfleet.cluster.balance import SpeedMeter, proportional_split
from tensorfleet.cluster.migration import Placement, RunOptions, migrate

JOB = Path(__file__).parent / "migrating_job.py"


@pytest.mark.parametrize(("examples", "speeds", "sizes"), [
    (16, [1.0, 0.5, 0.25], [8, 5, 3]),
    (24, [4.0, 1.0], [19, 5]),
    (8, [1.0, 1.0], [4, 4]),
    (7, [4.0, 2.0, 1.0], [3, 2, 2]),
    (2, [1.0, 1.0, 1.0], [1, 1, 0]),
    (16, [112.0, 29.0], [12, 4]),  # two parameter-server workers' batches (workers x global batch 8)
])
def test_a_step_is_split_in_proportion_to_speed_with_one_example_each(examples, speeds, sizes) -> None:
    assert proportional_split(examples, speeds) == sizes
    assert sum(sizes) == examples


def test_speeds_must_be_positive() -> None:
    with pytest.raises(ValueError,
                       match=r"speeds must be positive numbers, one per replica. Received: speeds=\[0, 0\]"):
        proportional_split(8, [0, 0])
    meter = SpeedMeter(2)
    assert not meter.ready
    meter.update([10.0, 30.0])
    meter.update([20.0, 10.0])
    assert meter.ready and meter.speeds.tolist() == [15.0, 20.0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_balanced_batches_follow_speed_and_train_the_same_update(tmp_path: Path) -> None:
    import tensorflow as tf

    from tensorfleet.cluster.jobstate import latest, tf_checkpoint_prefix

    tensors, logs = {}, {}
    for balance in (False, True):
        run = RunOptions(epochs=1, global_batch_size=24, balance=balance)
        with testing.slow_inputs(0.004, slowdown=(1.0, 4.0)):
            result = migrate(JOB, tmp_path / str(balance), to=Placement("mirrored", devices=2), run=run, timeout=280)
        reader = tf.train.load_checkpoint(tf_checkpoint_prefix(latest(tmp_path / str(balance))))
        tensors[balance] = {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k[0] != "_"}
        logs[balance] = "\n".join(result.output("worker:0"))
    splits = [[int(v) for v in m.split(", ")] for m in re.findall(r"replica batches \[(\d+, \d+)\]", logs[True])]
    assert splits and all(sum(s) == 24 and s[0] > s[1] for s in splits), splits  # the 4x slower replica gets less
    assert "replica batches" not in logs[False]
    for name, value in tensors[False].items():
        if name.startswith(("counts", "optimizer/_iterations")):
            np.testing.assert_array_equal(tensors[True][name], value)
        else:  # the same examples per step, summed in another grouping: float32 rounding apart
            np.testing.assert_allclose(tensors[True][name], value, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("job", ["migrating_job.py", "keras3_job.py"], ids=["tf_keras", "keras3"])
def test_parameter_server_workers_take_batches_by_speed_and_read_every_example_once(
        tmp_path: Path, job: str, request: pytest.FixtureRequest) -> None:
    import tensorflow as tf

    from tensorfleet.cluster.jobstate import read_state, tf_checkpoint_prefix

    if job.startswith("keras3"):
        request.getfixturevalue("keras3")  # skipped where Keras is 2.x (the tff track)
    run = RunOptions(epochs=2, global_batch_size=8, balance=True)
    with testing.slow_inputs(0.004, slowdown=(1.0, 4.0)):
        result = migrate(JOB.parent / job, tmp_path, to=Placement("parameter_server", workers=2, ps=1), run=run,
                         timeout=280)
    log = "\n".join(result.output("chief:0"))
    splits = [[int(v) for v in m.split(", ")] for m in re.findall(r"worker batches \[(\d+, \d+)\]", log)]
    # Both workers' batches add up to workers x global batch; worker 1, its input 4x slower, gets the smaller.
    assert splits and all(sum(s) == 16 and s[0] > s[1] for s in splits), splits
    per_worker = [int(v) for v in re.findall(r"epoch 2/2 end .* examples per worker \[(\d+), (\d+)\]", log)[0]]
    assert sum(per_worker) == 2 * 96 and per_worker[0] > per_worker[1], per_worker
    state, path = read_state(tmp_path)
    reader = tf.train.load_checkpoint(tf_checkpoint_prefix(path))
    assert set(reader.get_tensor("counts/.ATTRIBUTES/VARIABLE_VALUE").tolist()) == {2.0}  # each example once an epoch
    assert int(reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == state.step


@pytest.mark.parametrize(("to", "balance", "described"), [
    (Placement("mirrored", devices=2), False, r"mirrored over 2 device\(s\)"),
    (Placement("parameter_server", workers=2, ps=1), True, r"parameter_server with 2 worker\(s\) and 1 ps"),
])
def test_equal_shares_is_a_parameter_server_split_without_balance(tmp_path: Path, to, balance, described) -> None:
    from tensorfleet.cluster.migration import MigrationError

    run = RunOptions(epochs=1, global_batch_size=8, balance=balance)
    with testing.equal_shares(), pytest.raises(MigrationError, match=(
            r"equal_shares \(tensorfleet.testing\) is a parameter server's way of splitting the epoch, without "
            rf"balance. Received: equal_shares=True, balance={balance}, to={described}.")):
        migrate(JOB, tmp_path / "never", to=to, run=run, timeout=60)
    assert not (tmp_path / "never").exists()
