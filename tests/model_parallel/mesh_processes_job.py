"""One script for one process or N (``tensorfleet launch --workers N --mesh``): a Keras 3 model with a skip
connection and LayerNormalization, and a small GPT, each trained with Adam and its own ``fit`` on
``Mesh("b:2;m:2")`` and on one device of this process from the same weights. Prints ``RESULT {json}``:
each model's largest weight difference to one device, how far it moved, its step losses, and what this
process holds of the mesh (devices, the shards of one weight); then a tf_keras model under ZeRO stages 0-3:
its weight difference to one device and the elements of parameters and optimizer state each local device
holds."""

import json
import os
import shutil
import tempfile

import keras
import numpy as np

from tensorfleet.model_parallel.mesh import Mesh

L = keras.layers


def skip_net():  # Conv2D, Add (skip connection), LayerNormalization
    inputs = keras.Input((8, 8, 1), name="pixels")
    h = L.Conv2D(8, 3, padding="same", activation="relu", name="conv")(inputs)
    h = L.Dense(16, activation="gelu", name="d1")(L.Flatten(name="flat")(h))
    h2 = L.Dense(16, activation="tanh", name="d2")(h)
    h = L.LayerNormalization(name="ln")(L.Add(name="skip")([h, h2]))
    return keras.Model(inputs, L.Dense(10, name="logits")(h), name="skip_net")


def small_gpt():  # Embedding, a block of causal MultiHeadAttention + LayerNormalization + MLP, output head
    tokens = keras.Input((8,), dtype="int32", name="tokens")
    h = L.Embedding(32, 16, name="embed")(tokens)
    a = L.MultiHeadAttention(4, 4, name="attn")(h, h, use_causal_mask=True)
    h = L.LayerNormalization(name="ln_a")(L.Add()([h, a]))
    m = L.Dense(16, name="down")(L.Dense(32, activation="gelu", name="up")(h))
    h = L.LayerNormalization(name="ln_b")(L.Add()([h, m]))
    return keras.Model(tokens, L.Dense(32, name="head")(h), name="gpt")


class Steps(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.losses = getattr(self, "losses", []) + [float(logs["loss"])]


rng = np.random.RandomState(0)
data = {"skip_net": (rng.rand(128, 8, 8, 1).astype("float32"), (np.arange(128) % 10).astype("int32")),
        "gpt": (rng.randint(0, 32, (128, 8)).astype("int32"), None)}
data["gpt"] = (data["gpt"][0], np.roll(data["gpt"][0], -1, axis=1))
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# The mesh first: across processes it starts DTensor's runtime, which must come before TensorFlow's
meshes = {"skip_net": Mesh("b:2;m:2", "batch:b;hidden:m;channels:m"),
          "gpt": Mesh("b:2;m:2", "batch:b;hidden:m;heads:m;vocab:m")}
out = {"task": os.environ.get("TENSORFLEET_TASK"), "devices": meshes["skip_net"].devices}
for name, build in [("skip_net", skip_net), ("gpt", small_gpt)]:
    x, y = data[name]
    with meshes[name].scope():
        model = build()
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    keras.utils.set_random_seed(1)
    reference = build()
    initial = reference.get_weights()
    model.set_weights(initial)
    reference.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    steps = Steps()
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[steps])
    weights = model.get_weights()
    out[name] = {
        "weight_diff": {w.path: float(np.abs(a - b).max()) for w, a, b in zip(model.weights, weights,
                                                                               reference.get_weights())},
        "moved": max(float(np.abs(a - b).max()) for a, b in zip(weights, initial)),
        "steps": steps.losses}
    if name == "skip_net":  # evaluate, predict and a .keras file (each process its own) across the processes
        saved = os.path.join(tempfile.mkdtemp(), "skip_net.keras")
        model.save(saved)
        out[name].update(
            evaluate=[model.evaluate(x, y, batch_size=32, verbose=0),
                      reference.evaluate(x, y, batch_size=32, verbose=0)],
            predict_diff=float(np.abs(model.predict(x[:48], batch_size=16)
                                      - reference.predict(x[:48], verbose=0)).max()),
            loaded_diff=max(float(np.abs(a - b).max()) for a, b in zip(keras.models.load_model(saved).get_weights(),
                                                                         weights)))
        shutil.rmtree(os.path.dirname(saved))
    kernel = next(w for w in model.weights if w.path in ("d1/kernel", "up/kernel"))
    out[name]["local_shards"] = [list(t.shape) for t in __import__("tensorflow").experimental.dtensor.unpack(
        kernel.value.read_value())]


def zero_net(k2):  # tf_keras: an embedding table, a Dense split over m, a normalization, a split head
    tokens = k2.Input((4,), dtype="int32")
    h = k2.layers.Flatten()(k2.layers.Embedding(16, 8, name="embed")(tokens))
    h = k2.layers.LayerNormalization(name="ln")(k2.layers.Dense(16, activation="gelu", name="h")(h))
    return k2.Model(tokens, k2.layers.Dense(8, name="o")(h))


def held(variables):  # elements this process holds, per local device
    per_device = {}
    for v in variables:
        for shard in tf.experimental.dtensor.unpack(v.read_value()):
            per_device[shard.device] = per_device.get(shard.device, 0) + int(shard.shape.num_elements())
    return per_device


# tf_keras and ZeRO stages 0-3 (ZeRO is tf_keras's): what each process holds, measured from its variables
import tensorflow as tf  # noqa: E402

from tensorfleet.compat.keras import keras2  # noqa: E402

k2 = keras2()
x, y = rng.randint(0, 16, (64, 4)).astype("int32"), (np.arange(64) % 8).astype("int32")
k2.utils.set_random_seed(1)
reference = zero_net(k2)
initial = reference.get_weights()
reference.compile(optimizer=k2.optimizers.AdamW(1e-2, weight_decay=0.1),
                  loss=k2.losses.SparseCategoricalCrossentropy(True))
reference.fit(x, y, batch_size=16, shuffle=False, verbose=0)
for zero in range(4):
    with Mesh("b:2;m:2", "batch:b;hidden:m", zero=zero).scope():
        model = zero_net(k2)
        model.compile(optimizer=k2.optimizers.AdamW(1e-2, weight_decay=0.1),
                      loss=k2.losses.SparseCategoricalCrossentropy(True))
    model.set_weights(initial)
    model.fit(x, y, batch_size=16, shuffle=False, verbose=0)
    out[f"zero{zero}"] = {
        "weight_diff": max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference.get_weights())),
        "parameters": held(model.weights), "optimizer_state": held(model.optimizer.variables)}
# The model dimension across the processes ("m:2;b:2": each data replica spans both), Keras 3's fit
x, y = data["skip_net"]
with Mesh("m:2;b:2", "batch:b;hidden:m;channels:m").scope():
    model = skip_net()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
keras.utils.set_random_seed(1)
reference = skip_net()
model.set_weights(reference.get_weights())
reference.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
out["model_across"] = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference.get_weights()))
print("RESULT " + json.dumps(out))
