"""Pipeline stages and schedules: exact orders, gradient equality, timelines, bubbles, plots."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet.compat.keras import keras2
from tensorfleet.model_parallel import pipeline as pl
from tensorfleet.model_parallel.pipeline import Pass, ScheduledOp
from tensorfleet.models.datasets import load_digits

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

F, B = Pass.FORWARD, Pass.BACKWARD


def _mlp(depth: int = 8, width: int = 16, seed: int = 0) -> tf_keras.Model:
    layers = [tf_keras.layers.Dense(width, activation="tanh",
                                    kernel_initializer=tf_keras.initializers.GlorotUniform(seed + i),
                                    bias_initializer=tf_keras.initializers.RandomNormal(stddev=0.1, seed=100 + i))
              for i in range(depth - 1)]
    layers.append(tf_keras.layers.Dense(10, kernel_initializer=tf_keras.initializers.GlorotUniform(seed + depth)))
    model = tf_keras.Sequential(layers, name="chain")
    model.build((None, 64))
    return model


@pytest.fixture(scope="module")
def batch():
    split = load_digits(flat=True)
    return split.x_train[:32], split.y_train[:32]


def _reference(model, x, y):
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    return float(loss), tape.gradient(loss, model.trainable_variables)


def test_one_f_one_b_orders_are_exact():
    orders = pl.schedule_orders("1f1b", 3, 4)
    assert orders[0] == [ScheduledOp(F, 0, 0), ScheduledOp(F, 0, 1), ScheduledOp(F, 0, 2), ScheduledOp(B, 0, 0),
                         ScheduledOp(F, 0, 3), ScheduledOp(B, 0, 1), ScheduledOp(B, 0, 2), ScheduledOp(B, 0, 3)]
    assert orders[2] == [op for j in range(4) for op in (ScheduledOp(F, 2, j), ScheduledOp(B, 2, j))]
    gpipe = pl.schedule_orders("gpipe", 2, 2)
    assert gpipe[1] == [ScheduledOp(F, 1, 0), ScheduledOp(F, 1, 1), ScheduledOp(B, 1, 0), ScheduledOp(B, 1, 1)]


def test_interleaved_device_holds_chunks_p_apart():
    orders = pl.schedule_orders("interleaved", 2, 4, virtual_stages=2)
    assert {op.stage for op in orders[0]} == {0, 2}
    assert {op.stage for op in orders[1]} == {1, 3}
    assert orders[0][:4] == [ScheduledOp(F, 0, 0), ScheduledOp(F, 0, 1), ScheduledOp(F, 2, 0), ScheduledOp(F, 2, 1)]
    assert all(len(order) == 2 * 4 * 2 for order in orders)


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 2, 3, 1),
                                            ("interleaved", 4, 8, 2), ("interleaved", 2, 6, 3)])
def test_simulated_bubble_equals_theory(schedule, p, m, v):
    events = pl.simulate(pl.schedule_orders(schedule, p, m, v), forward_cost=1.0 / v, backward_cost=2.0 / v)
    assert pl.bubble_fraction(events) == pytest.approx(pl.theoretical_bubble(p, m, v), abs=1e-12)
    assert len(events) == 2 * p * m * v


def test_peak_activations_gpipe_m_and_one_f_one_b_at_most_p():
    assert pl.peak_activations(pl.simulate(pl.schedule_orders("gpipe", 4, 8))) == 8
    assert pl.peak_activations(pl.simulate(pl.schedule_orders("1f1b", 4, 8))) == 4
    assert pl.peak_activations(pl.simulate(pl.schedule_orders("1f1b", 4, 2))) == 2


def test_partition_by_indices_and_balanced_by_parameters():
    assert pl.partition_layers(list("abcdef"), 3, boundaries=[1, 5]) == [["a"], ["b", "c", "d", "e"], ["f"]]
    assert pl.partition_layers(list("abcde"), 2, weights=[10, 1, 1, 1, 14]) == [["a", "b", "c", "d"], ["e"]]
    assert pl.partition_layers(list("abcd"), 2, weights=[1, 1, 1, 1]) == [["a", "b"], ["c", "d"]]
    model = _mlp(depth=4, width=16)
    stages = pl.partition_layers(model.layers, 2)
    assert [len(s) for s in stages] == [1, 3]  # 64*16+16 = 1040 vs 272+272+170 = 714


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 2, 4, 1), ("1f1b", 4, 4, 1), ("1f1b", 2, 3, 1),
                                            ("interleaved", 2, 4, 2)])
def test_pipeline_gradients_equal_unsplit_model(schedule, p, m, v, batch, logical_cpus):
    x, y = batch
    model = _mlp()
    ref_loss, ref_grads = _reference(model, x, y)
    pipe = pl.Pipeline(model, num_stages=p, micro_batches=m, schedule=schedule, virtual_stages=v)
    step = pipe.compute_gradients(x, y)
    assert step.loss == pytest.approx(ref_loss, abs=1e-5)
    assert len(step.gradients) == len(ref_grads) == 16
    for got, want in zip(step.gradients, ref_grads):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
    assert len(step.events) == 2 * p * m * v
    assert {(e.stage, e.micro_batch, e.phase) for e in step.events} == {
        (s, j, ph) for s in range(p * v) for j in range(m) for ph in (F, B)}
    assert all(e.device == e.stage % p for e in step.events)
    # the forward activations were computed on the stage's own device
    assert all(e.placed_on.endswith(f"device:CPU:{e.stage % p}") for e in step.events if e.phase is F)
    assert 0.0 <= step.bubble_fraction < 1.0


def test_hybrid_data_parallel_pipeline_on_a_2x2_mesh(batch, logical_cpus):
    x, y = batch
    model = _mlp(depth=4)
    ref_loss, ref_grads = _reference(model, x, y)
    pipe = pl.Pipeline(model, num_stages=2, micro_batches=2, schedule="1f1b", data_parallel=2)
    assert [pipe.device(r, s) for r in range(2) for s in range(2)] == logical_cpus[:4]
    step = pipe.compute_gradients(x, y)
    assert step.loss == pytest.approx(ref_loss, abs=1e-5)
    for got, want in zip(step.gradients, ref_grads):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
    assert {e.replica for e in step.events} == {0, 1}
    assert all(e.placed_on.endswith(f"device:CPU:{2 * e.replica + e.stage}") for e in step.events if e.phase is F)


def test_timeline_with_known_cost_and_plot_is_png(batch, tmp_path):
    # How close the measured bubble comes to theory is timing, measured by bench/pipeline_bubble.py;
    # here only what holds on any machine: ops padded to their cost, one op at a time per device,
    # dependencies respected, and the bubble computed from the recorded timeline.
    x, y = batch
    pipe = pl.Pipeline(_mlp(depth=4), num_stages=2, micro_batches=4, schedule="gpipe", op_cost=(0.02, 0.04))
    step = pipe.compute_gradients(x, y)
    assert all(e.end - e.start >= (0.02 if e.phase is F else 0.04) for e in step.events)
    for device in (0, 1):
        ops = sorted((e for e in step.events if e.device == device), key=lambda e: e.start)
        assert all(a.end <= b.start for a, b in zip(ops, ops[1:]))
        assert [(e.phase, e.micro_batch) for e in ops] == [(F, j) for j in range(4)] + [(B, j) for j in range(4)]
    end = {(e.stage, e.micro_batch, e.phase): e.end for e in step.events}
    for e in step.events:
        if e.phase is F and e.stage == 1:
            assert e.start >= end[(0, e.micro_batch, F)]
        if e.phase is B and e.stage == 0:
            assert e.start >= end[(1, e.micro_batch, B)]
    makespan = max(e.end for e in step.events) - min(e.start for e in step.events)
    busy = sum(e.end - e.start for e in step.events)
    assert step.bubble_fraction == pytest.approx(1 - busy / (2 * makespan))
    assert step.peak_activations == 4
    path = pipe.plot(step.events, tmp_path / "schedule.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fit_trains_and_matches_plain_sgd(batch):
    x, y = batch
    model, twin = _mlp(depth=4), _mlp(depth=4)
    pipe = pl.Pipeline(model, num_stages=2, micro_batches=2, schedule="1f1b")
    history = pipe.fit(x, y, optimizer=tf_keras.optimizers.SGD(0.5), epochs=3, batch_size=16, verbose=False)
    opt = tf_keras.optimizers.SGD(0.5)
    losses = []
    for _ in range(3):
        for s in (0, 16):
            loss, grads = _reference(twin, x[s:s + 16], y[s:s + 16])
            opt.apply_gradients(zip(grads, twin.trainable_variables))
            losses.append(loss)
    np.testing.assert_allclose(history["step_loss"], losses, atol=1e-5)
    assert history["loss"][-1] < history["loss"][0]


def test_bad_pipeline_arguments_are_clear_errors(logical_cpus):
    model = _mlp(depth=4)
    with pytest.raises(ValueError, match=r"micro_batches to be a multiple .* Received: micro_batches=3, devices=2"):
        pl.Pipeline(model, num_stages=2, micro_batches=3, schedule="interleaved", virtual_stages=2)
    with pytest.raises(ValueError, match=r"Unknown pipeline schedule 'gpip'. Did you mean 'gpipe'"):
        pl.Pipeline(model, num_stages=2, schedule="gpip")
    with pytest.raises(ValueError, match=r"virtual_stages applies to the 'interleaved' schedule only"):
        pl.Pipeline(model, num_stages=2, schedule="gpipe", virtual_stages=2)
    with pytest.raises(ValueError, match=r"num_stages must be at most the number of layers \(4\).*num_stages=8"):
        pl.Pipeline(model, num_stages=4, virtual_stages=2, schedule="interleaved")
    with pytest.raises(ValueError, match=r"needs 8 devices; this machine has 4"):
        pl.Pipeline(model, num_stages=4, data_parallel=2)
    with pytest.raises(ValueError,
                       match=r"boundaries must be 1 increasing layer indices .* Received: boundaries=\[4\]"):
        pl.Pipeline(model, num_stages=2, boundaries=[4])
    with pytest.raises(ValueError, match=r"micro_batches must be a positive integer. Received: micro_batches=0"):
        pl.Pipeline(model, num_stages=2, micro_batches=0)
    with pytest.raises(ValueError, match=r"op_cost\[1\] must be a finite number >= 0. Received: op_cost\[1\]=-0.5"):
        pl.Pipeline(model, num_stages=2, op_cost=(0.1, -0.5))
    with pytest.raises(ValueError,
                       match=r"op_cost must be \(forward_seconds, backward_seconds\). Received: op_cost=\(0.1,\)"):
        pl.Pipeline(model, num_stages=2, op_cost=(0.1,))
    unbuilt = tf_keras.Sequential([tf_keras.layers.Dense(3)])
    with pytest.raises(ValueError, match=r"must be built"):
        pl.Pipeline(unbuilt, num_stages=1)
    inputs = tf_keras.Input((4,))
    branch = tf_keras.Model(inputs, tf_keras.layers.Add()([tf_keras.layers.Dense(4)(inputs), inputs]))
    with pytest.raises(ValueError, match=r"form one chain"):
        pl.Pipeline(branch, num_stages=2)
    with pytest.raises(ValueError, match=r"at least data_parallel x micro_batches = 4 examples. Received: batch of 2"):
        pl.Pipeline(model, num_stages=2, micro_batches=4).compute_gradients(
            np.zeros((2, 64), np.float32), np.zeros(2, np.int32))


def test_unbuilt_model_gets_each_stage_weights_on_its_device(batch, logical_cpus):
    x, y = batch
    layers = [tf_keras.layers.Dense(16, activation="relu", kernel_initializer=tf_keras.initializers.GlorotUniform(i))
              for i in range(3)] + [tf_keras.layers.Dense(10,
                                                          kernel_initializer=tf_keras.initializers.GlorotUniform(3))]
    model = tf_keras.Sequential(layers)
    assert not model.built
    pipe = pl.Pipeline(model, num_stages=4, micro_batches=4, schedule="1f1b", input_shape=(64,))
    assert model.built and model.output_shape == (None, 10)
    for index, stage in enumerate(pipe.stages):
        for variable in (v for layer in stage for v in layer.trainable_variables):
            assert variable.device.endswith(f"device:CPU:{index}"), (index, variable.name, variable.device)
    ref_loss, ref_grads = _reference(model, x, y)
    step = pipe.compute_gradients(x, y)
    assert step.loss == pytest.approx(ref_loss, abs=1e-5)
    for got, want in zip(step.gradients, ref_grads):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)


def test_keras_fit_trains_through_the_pipeline(batch):
    x, y = batch
    model, twin = _mlp(depth=4), _mlp(depth=4)
    trainer = pl.Pipeline(model, num_stages=2, micro_batches=2, schedule="gpipe").keras_model()
    trainer.compile(optimizer=tf_keras.optimizers.SGD(0.5), run_eagerly=True)
    history = trainer.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    opt = tf_keras.optimizers.SGD(0.5)
    epoch_losses = []
    for _ in range(2):
        losses = []
        for s in (0, 16):
            loss, grads = _reference(twin, x[s:s + 16], y[s:s + 16])
            opt.apply_gradients(zip(grads, twin.trainable_variables))
            losses.append(loss)
        epoch_losses.append(sum(losses) / 2)
    np.testing.assert_allclose(history.history["loss"], epoch_losses, atol=1e-5)
    assert all(0.0 <= b < 1.0 for b in history.history["bubble_fraction"])
    for got, want in zip(model.get_weights(), twin.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(trainer.predict(x[:4], verbose=0), twin(x[:4]).numpy(), atol=1e-5)


def test_keras_fit_without_run_eagerly_is_a_clear_error(batch):
    x, y = batch
    trainer = pl.Pipeline(_mlp(depth=4), num_stages=2, micro_batches=2).keras_model()
    trainer.compile(optimizer="sgd")
    with pytest.raises(RuntimeError, match=r"compile it with run_eagerly=True"):
        trainer.fit(x, y, batch_size=16, epochs=1, verbose=0)
