"""A Keras 3 model through a pipeline: the same gradients as the unsplit model, ``fit`` and the Keras
front (``keras_model()``) training as plain SGD does, and a model that is no chain named at the layer."""

from __future__ import annotations

import numpy as np
import pytest

from tensorfleet.model_parallel import chain_layers, pipeline as pl
from tensorfleet.models.datasets import load_digits


def _mlp(keras, depth: int = 4, width: int = 16):
    layers = [keras.layers.Dense(width, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(i),
                                 bias_initializer=keras.initializers.RandomNormal(stddev=0.1, seed=100 + i))
              for i in range(depth - 1)]
    layers.append(keras.layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(depth)))
    model = keras.Sequential(layers, name="chain")
    model.build((None, 64))
    return model


def _reference(keras, model, x, y):
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    return float(loss), tape.gradient(loss, model.trainable_variables)


@pytest.fixture(scope="module")
def batch():
    split = load_digits(flat=True)
    return split.x_train[:32], split.y_train[:32]


@pytest.mark.parametrize("schedule,p,m,v", [("1f1b", 4, 4, 1), ("interleaved", 2, 4, 2)])
def test_keras3_pipeline_gradients_equal_the_unsplit_model(keras3, schedule, p, m, v, batch, logical_cpus):
    x, y = batch
    model = _mlp(keras3, depth=8)
    ref_loss, ref_grads = _reference(keras3, model, x, y)
    step = pl.Pipeline(model, num_stages=p, micro_batches=m, schedule=schedule,
                       virtual_stages=v).compute_gradients(x, y)
    assert step.loss == pytest.approx(ref_loss, abs=1e-5)
    assert len(step.gradients) == len(ref_grads) == 16
    for got, want in zip(step.gradients, ref_grads):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    assert all(e.placed_on.endswith(f"device:CPU:{e.stage % p}") for e in step.events if e.phase is pl.Pass.FORWARD)


def test_keras3_pipeline_fit_and_keras_front_train_as_plain_sgd(keras3, batch):
    x, y = batch
    model, front_model, twin = _mlp(keras3), _mlp(keras3), _mlp(keras3)
    history = pl.Pipeline(model, num_stages=2, micro_batches=2, schedule="1f1b").fit(
        x, y, optimizer=keras3.optimizers.SGD(0.5), epochs=2, batch_size=16, verbose=False)
    trainer = pl.Pipeline(front_model, num_stages=2, micro_batches=2, schedule="gpipe").keras_model()
    trainer.compile(optimizer=keras3.optimizers.SGD(0.5), run_eagerly=True)
    front = trainer.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    optimizer, losses = keras3.optimizers.SGD(0.5), []
    for _ in range(2):
        for s in (0, 16):
            loss, grads = _reference(keras3, twin, x[s:s + 16], y[s:s + 16])
            optimizer.apply_gradients(zip(grads, twin.trainable_variables))
            losses.append(loss)
    np.testing.assert_allclose(history["step_loss"], losses, atol=1e-5)
    np.testing.assert_allclose(front.history["loss"], [np.mean(losses[:2]), np.mean(losses[2:])], atol=1e-5)
    for trained in (model, front_model):
        for got, want in zip(trained.get_weights(), twin.get_weights()):
            np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(trainer.predict(x[:4], verbose=0), np.asarray(twin(x[:4])), atol=1e-5)


def test_a_keras3_model_that_is_no_chain_is_named_at_its_layer(keras3):
    inputs = keras3.Input((8,))
    h = keras3.layers.Dense(8, name="d1")(inputs)
    model = keras3.Model(inputs, keras3.layers.Add(name="skip")([h, keras3.layers.Dense(8, name="d2")(h)]))
    assert [layer.name for layer in chain_layers(keras3.Sequential([keras3.Input((8,)),
                                                                    keras3.layers.Dense(2, name="a"),
                                                                    keras3.layers.Dense(2, name="b")]))] == ["a", "b"]
    with pytest.raises(ValueError, match=r"layer 'skip' of model .* does not\. Wrap branching parts in one layer\. "
                                         r"Received: layer 'skip' of type Add, which takes 2 inputs \('d1', 'd2'\)$"):
        chain_layers(model)


def test_an_unbuilt_keras3_model_gets_each_stage_weights_on_its_device(keras3, batch, logical_cpus):
    x, y = batch
    model = keras3.Sequential([keras3.layers.Dense(16, activation="tanh"), keras3.layers.Dense(16, activation="tanh"),
                               keras3.layers.Dense(10)], name="unbuilt")
    pipe = pl.Pipeline(model, num_stages=2, micro_batches=2, boundaries=[1], input_shape=(64,))
    devices = [[w.value.device for w in layer.weights] for stage in pipe.stages for layer in stage]
    assert [{d.rsplit(":", 1)[-1] for d in layer} for layer in devices] == [{"0"}, {"1"}, {"1"}]
    ref_loss, ref_grads = _reference(keras3, model, x, y)
    step = pipe.compute_gradients(x, y)
    assert step.loss == pytest.approx(ref_loss, abs=1e-5)
    for got, want in zip(step.gradients, ref_grads):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
