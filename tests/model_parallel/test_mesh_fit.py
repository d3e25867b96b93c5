"""Keras' own fit on a mesh with validation: validation_data and validation_split give the same
validation metrics as evaluate on the same data, and as one device's fit; bad validation input is
one clear error. DTensor runs in a process of its own (see tests/model_parallel/test_mesh_zero.py)."""

from __future__ import annotations

import pytest

from tests.model_parallel.test_mesh_zero import run_dtensor_script

_SCRIPT = r"""
import json
import numpy as np
from tensorfleet.strategies.devices import simulate_devices
simulate_devices(4)
import tensorflow as tf
from tensorfleet.model_parallel.mesh import Mesh

L = tf.keras.layers

def build():
    return tf.keras.Sequential([tf.keras.Input((12,)), L.Dense(16, activation="relu", name="h"),
                                L.Dense(4, name="o")])

rng = np.random.RandomState(0)
x, y = rng.rand(96, 12).astype("float32"), (np.arange(96) % 4).astype("int32")
xv, yv = rng.rand(48, 12).astype("float32"), (np.arange(48) % 4).astype("int32")
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
tf.keras.utils.set_random_seed(1)
reference = build()
initial = reference.get_weights()
reference.compile(optimizer=tf.keras.optimizers.Adam(1e-2), loss=loss, metrics=["accuracy"])
ref = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, validation_data=(xv, yv)).history
out = {"reference": ref}
for zero in (0, 3):
    mesh = Mesh("b:2;m:2", "batch:b;hidden:m", zero=zero)
    with mesh.scope():
        model = build()
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-2), loss=loss, metrics=["accuracy"])
    model.set_weights(initial)
    seen = []
    stop = tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(sorted(logs)))
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, validation_data=(xv, yv),
                          callbacks=[stop]).history
    evaluated = model.evaluate(xv, yv, batch_size=16, verbose=0, return_dict=True)
    split = model.fit(x, y, batch_size=16, epochs=1, verbose=0, validation_split=0.25).history
    out[zero] = {"history": history, "seen": seen, "evaluate": evaluated, "split": split,
                 "split_evaluate": model.evaluate(x[72:], y[72:], batch_size=16, verbose=0, return_dict=True)}
errors = []
for kwargs in [{"validation_data": (xv, yv, np.ones(48))}, {"validation_split": 1.5},
               {"validation_data": (xv[:8], yv[:8])}]:
    try:
        model.fit(x, y, batch_size=16, verbose=0, **kwargs)
    except ValueError as exc:
        errors.append(str(exc))
out["errors"] = errors
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fit_with_validation_data_and_split_reports_what_evaluate_and_one_device_give():
    out = run_dtensor_script(_SCRIPT, timeout=380)
    ref = out["reference"]
    for zero in ("0", "3"):
        row = out[zero]
        history = row["history"]
        assert sorted(history) == ["accuracy", "loss", "val_accuracy", "val_loss"], zero
        assert row["seen"] == [["accuracy", "loss", "val_accuracy", "val_loss"]] * 2
        for name in ("loss", "val_loss", "val_accuracy"):
            assert max(abs(a - b) for a, b in zip(history[name], ref[name])) < 1e-5, (zero, name, history, ref)
        # the last epoch's validation ran with the final weights: evaluate on the same data agrees
        assert abs(history["val_loss"][-1] - row["evaluate"]["loss"]) < 1e-6, row
        assert history["val_accuracy"][-1] == row["evaluate"]["accuracy"]
        # validation_split holds out the last quarter (24 examples: one full batch of 16)
        assert abs(row["split"]["val_loss"][0] - row["split_evaluate"]["loss"]) < 1e-6, row
    assert out["errors"] == [
        "validation_data on a mesh must be a pair (x_val, y_val) of arrays or a dtensor.DTensorDataset; sample "
        "weights are not supported. Received: validation_data of type tuple with 3 items",
        "validation_split must be a finite number > 0 and < 1. Received: validation_split=1.5",
        "validation x and y must hold the same number of examples, at least batch_size (16). Received: 8 and 8",
    ]


_SHUFFLE_SCRIPT = r"""
import json
import numpy as np
from tensorfleet.strategies.devices import simulate_devices
simulate_devices(4)
import tensorflow as tf
from tensorflow.experimental import dtensor
from tensorfleet.model_parallel.mesh import Mesh

x, y = np.arange(64 * 3, dtype="float32").reshape(64, 3), np.arange(64, dtype="int32")
mesh = Mesh("b:2;m:2", "batch:b;hidden:m")
with mesh.scope():
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4, name="d")])
    model.compile(optimizer="sgd", loss="mse")


def orders(batches=4):  # the label (example number) each device reads in a shuffled epoch of 4 batches of 16
    dataset, _ = model.mesh_trainer._dataset(x, y, 16, shuffle=True)
    seen = [[] for _ in mesh.devices]
    for _, (xb, yb) in zip(range(batches), dataset):
        for device, part in enumerate(dtensor.unpack(yb)):
            seen[device] += part.numpy().tolist()
    return seen


unseeded = orders()
tf.keras.utils.set_random_seed(3)
first = orders()
tf.keras.utils.set_random_seed(3)
again = orders()
print("RESULT " + json.dumps({"unseeded": unseeded, "first": first, "again": again}))
"""


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_shuffled_epoch_feeds_the_model_shards_of_a_replica_the_same_examples():
    out = run_dtensor_script(_SHUFFLE_SCRIPT, timeout=280)
    for seen in (out["unseeded"], out["first"]):
        # devices 0 and 1 hold the two model shards of replica b=0, devices 2 and 3 those of b=1
        assert seen[0] == seen[1] and seen[2] == seen[3], seen
        assert sorted(seen[0] + seen[2]) == list(range(64))  # the replicas split each batch: every example once
        assert seen[0] != list(range(0, 64, 2)) and seen[0] != [i for i in range(64) if i % 16 < 8]  # shuffled
    assert out["first"] == out["again"]  # tf.keras.utils.set_random_seed decides the order
