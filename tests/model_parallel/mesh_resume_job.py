"""A Keras 3 model on ``Mesh("b:2;m:2")`` trained for 3 epochs with ``fault_tolerance.callbacks`` (a backup per
epoch, written by the first process), under ``launch(..., mesh=True)`` with restarts; and the same model on one
device in this process, uninterrupted. Prints ``RESULT {json}``: the attempt, the largest weight difference."""

import json
import os

import keras
import numpy as np

from tensorfleet.cluster import fault_tolerance
from tensorfleet.model_parallel.mesh import Mesh

mesh = Mesh("b:2;m:2", "batch:b;hidden:m")
mesh.devices  # DTensor's runtime first


def mlp():
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu", name="h"),
                             keras.layers.LayerNormalization(name="ln"), keras.layers.Dense(4, name="o")])


rng = np.random.RandomState(0)
x, y = rng.rand(64, 16).astype("float32"), (np.arange(64) % 4).astype("int32")
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
with mesh.scope():
    model = mlp()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
keras.utils.set_random_seed(1)
reference = mlp()
model.set_weights(reference.get_weights())
reference.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
reference.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0, callbacks=fault_tolerance.callbacks(keras=model))
print("RESULT " + json.dumps({
    "task": os.environ.get("TENSORFLEET_TASK"), "attempt": int(os.environ.get("TENSORFLEET_ATTEMPT", "0")),
    "weight_diff": max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference.get_weights()))}))
