"""What ProfileCallback costs outside the recorded steps: Keras calls none of its batch hooks there."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet import profiling
from tensorfleet.compat.keras import keras2
from tensorfleet.profiling.xspace import task_traces

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


class _Counted(profiling.ProfileCallback):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epoch, self.calls = 0, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append((self.epoch, batch))
        super().on_train_batch_end(batch, logs)


def _fit(callbacks: list, epochs: int = 5) -> None:
    model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.ones((8, 2), "float32"))).batch(2)
    model.fit(data.repeat(), steps_per_epoch=4, epochs=epochs, verbose=0, callbacks=callbacks)


def test_batch_hooks_run_only_in_the_epochs_that_hold_the_chosen_steps(tmp_path):
    callback = _Counted(tmp_path, steps="9-10")  # epoch 2's steps 1 and 2
    _fit([callback])
    assert callback.calls == [(2, 0), (2, 1), (2, 2), (2, 3)]
    (trace,) = task_traces(tmp_path)
    assert [s.number for s in trace.steps] == [1, 2]
    # Steps are still counted from 0 across epochs, and Keras' dispatch is back on after fit.
    assert callback.seen == 20 and not callback.capture.running


def test_another_callback_that_needs_batch_hooks_still_gets_every_one(tmp_path):
    callback = _Counted(tmp_path, steps="9-10")
    seen = []
    other = tf_keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))
    _fit([callback, other], epochs=3)
    assert seen == [0, 1, 2, 3] * 3
    assert len(callback.calls) == 12


def test_with_several_steps_per_call_the_calls_holding_the_chosen_steps_are_recorded(tmp_path):
    model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(2)])
    model.compile("sgd", "mse", steps_per_execution=2)
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.ones((8, 2), "float32"))).batch(2)
    callback = profiling.ProfileCallback(tmp_path, steps="4-7")
    model.fit(data.repeat(), steps_per_epoch=6, epochs=2, verbose=0, callbacks=[callback])
    (trace,) = task_traces(tmp_path)
    # Keras runs steps 4-5 (epoch 0's 4 and 5) in one call and 6-7 (epoch 1's 0 and 1) in the next;
    # each call is annotated with its first step.
    assert [s.number for s in trace.steps] == [4, 0]
    assert callback.seen == 12 and not callback.capture.running


def _keras3_fit(keras, callback, *, epochs: int, steps_per_execution: int = 1, steps_per_epoch: int = 4) -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.ones((8, 2), "float32"))).batch(2)
    model.fit(data.repeat(), steps_per_epoch=steps_per_epoch, epochs=epochs, verbose=0, shuffle=False,
              callbacks=[callback])


def test_fit_of_a_keras_3_model_records_the_chosen_steps_annotated_as_tf_keras_does(tmp_path, keras3):
    callback = profiling.ProfileCallback(tmp_path, steps="9-10")  # epoch 2's steps 1 and 2
    _keras3_fit(keras3, callback, epochs=5)
    (trace,) = task_traces(tmp_path)
    assert [s.number for s in trace.steps] == [1, 2]  # Keras 3 annotates no step: the callback did
    assert all(s.duration_ms > 0 for s in trace.steps)
    assert callback.seen == 20 and not callback.capture.running
    profile = profiling.analyze(tmp_path, skip_first=False)
    assert [t.steps for t in profile.tasks] == [2]


def test_keras_3_with_several_steps_per_call_records_the_calls_holding_the_chosen_steps(tmp_path, keras3):
    callback = profiling.ProfileCallback(tmp_path, steps="4-7")
    _keras3_fit(keras3, callback, epochs=2, steps_per_execution=2, steps_per_epoch=6)
    (trace,) = task_traces(tmp_path)
    assert [s.number for s in trace.steps] == [4, 0]  # as tf_keras: each call annotated with its first step
    assert callback.seen == 12 and not callback.capture.running


def test_the_callback_refuses_what_is_not_a_keras_model(tmp_path):
    callback = profiling.ProfileCallback(tmp_path, steps="0-1")
    with pytest.raises(TypeError,
                       match=r"^tfl\.profiling\.ProfileCallback takes a Keras model \(Keras 3 or tf_keras\)\. "
                                        r"Received: model of type object$"):
        callback.set_model(object())
