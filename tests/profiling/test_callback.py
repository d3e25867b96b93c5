"""What ProfileCallback costs outside the recorded steps: Keras calls none of its batch hooks there."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet import profiling
from tensorfleet.profiling.xspace import task_traces


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
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
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
    other = tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))
    _fit([callback, other], epochs=3)
    assert seen == [0, 1, 2, 3] * 3
    assert len(callback.calls) == 12


def test_with_several_steps_per_call_the_calls_holding_the_chosen_steps_are_recorded(tmp_path):
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", "mse", steps_per_execution=2)
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.ones((8, 2), "float32"))).batch(2)
    callback = profiling.ProfileCallback(tmp_path, steps="4-7")
    model.fit(data.repeat(), steps_per_epoch=6, epochs=2, verbose=0, callbacks=[callback])
    (trace,) = task_traces(tmp_path)
    # Keras runs steps 4-5 (epoch 0's 4 and 5) in one call and 6-7 (epoch 1's 0 and 1) in the next;
    # each call is annotated with its first step.
    assert [s.number for s in trace.steps] == [4, 0]
    assert callback.seen == 12 and not callback.capture.running


def test_fit_of_a_keras_3_model_refuses_the_callback_before_recording(tmp_path):
    keras = pytest.importorskip("keras", reason="Keras 3 is not installed (the tff track has Keras 2.14)")
    if not keras.__version__.startswith("3."):
        pytest.skip(f"keras {keras.__version__} is Keras 2 (the tff track): no Keras 3 model to refuse")
    from tensorfleet.compat.keras import Keras3ModelError

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    with pytest.raises(Keras3ModelError, match=r"^tfl\.profiling\.ProfileCallback runs Keras 2 \(tf_keras\) models only for now, and received a Keras 3 model "
                                               r"\(keras\.src\.models\.sequential\.Sequential\)\. tensorfleet runs "
                                               r"Keras 2 models"):
        model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), epochs=1, verbose=0,
                  callbacks=[profiling.ProfileCallback(tmp_path, steps="0-1")])
    assert not list(tmp_path.rglob("*.xplane.pb"))
