"""ZeRO stages 0-3 over the batch axis of a 2x2 mesh: what each device holds, read from the
tensors, equals what the planner predicts from the mesh's own layout decisions, and training
equals stage 0 and one device (AdamW with global-norm clipping, plain SGD with clipping by norm;
an embedding table, whose gradient is IndexedSlices, among the weights).
DTensor runs in a process of its own (its collectives clash with tf.distribute strategies that
other tests build in the suite's process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tensorfleet.model_parallel.mesh import Mesh
from tests.conftest import keras2_env

_SCRIPT = r"""
import json
import numpy as np
from tensorfleet.strategies.devices import simulate_devices
simulate_devices(4)
import tensorflow as tf
from tensorflow.experimental import dtensor
from tensorfleet.model_parallel.mesh import Mesh
from tensorfleet.model_parallel.mesh.zero import ZeroVariable
from tensorfleet.planner.splits import model_state_bytes

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)
L = tf_keras.layers

def build():  # an embedding table (read by a gather), a split Dense, a normalization, a split head
    tokens = tf_keras.Input((4,), dtype="int32")
    h = L.Flatten()(L.Embedding(16, 8, name="embed")(tokens))
    h = L.LayerNormalization(name="ln")(L.Dense(16, activation="gelu", name="h")(h))
    return tf_keras.Model(tokens, L.Dense(8, name="o")(h))

class Steps(tf_keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.losses = getattr(self, "losses", []) + [float(logs["loss"])]

def held(tensors):
    per_device = {}
    for t in tensors:
        for shard in dtensor.unpack(t.read_value() if hasattr(t, "read_value") else t):
            per_device[shard.device] = per_device.get(shard.device, 0) + int(shard.shape.num_elements())
    return sorted(per_device.values())

OPTIMIZERS = {"adamw_global_clip": "tf_keras.optimizers.AdamW(1e-2, weight_decay=0.1, global_clipnorm=0.05)",
              "sgd_clip": "tf_keras.optimizers.SGD(0.5, clipnorm=0.05)"}  # no momentum: see with_mesh
x = np.random.RandomState(0).randint(0, 16, (80, 4)).astype("int32")
y = (np.arange(80) % 8).astype("int32")
loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
out = {}
for key, optimizer in OPTIMIZERS.items():
    tf_keras.utils.set_random_seed(1)
    reference = build()
    initial = reference.get_weights()
    reference.compile(optimizer=eval(optimizer), loss=loss)
    ref_steps = Steps()
    reference.fit(x, y, batch_size=16, shuffle=False, verbose=0, callbacks=[ref_steps])
    for zero in range(4):
        mesh = Mesh("b:2;m:2", "batch:b;hidden:m", zero=zero)
        with mesh.scope():
            model = build()
            model.compile(optimizer=eval(optimizer), loss=loss)
        model.set_weights(initial)
        steps = Steps()
        model.fit(x, y, batch_size=16, shuffle=False, verbose=0, callbacks=[steps])
        grads = model.mesh_trainer.step_gradients(x[:16], y[:16])
        row = {"steps": steps.losses, "ref_steps": ref_steps.losses,
               "weights": [w.tolist() for w in model.get_weights()],
               "ref_diff": float(max(np.abs(a - b).max()
                                     for a, b in zip(model.get_weights(), reference.get_weights())))}
        if key == "adamw_global_clip":
            planned = model_state_bytes(mesh.weight_splits(model), "adam", zero=zero)  # AdamW: the same m and v
            row.update(
                layouts={v.name: list(v.layout.sharding_specs) for v in model.weights},
                zero_variables=sorted(v.name for v in model.weights if isinstance(v, ZeroVariable)),
                slots={v.name: list(v.layout.sharding_specs) for v in model.optimizer.variables
                       if "/h/" in v.name or "/embed/" in v.name},
                grads={v.name: list(dtensor.fetch_layout(g).sharding_specs)
                       for v, g in zip(model.trainable_variables, grads)},
                held={"parameters": held(model.weights), "gradients": held(grads),
                      "optimizer_state": held(model.optimizer.variables)},
                planned={k: v / 4 for k, v in planned.items()})  # float32: 4 bytes an element
        out[f"{key}/{zero}"] = row
print("RESULT " + json.dumps(out))
"""


def run_dtensor_script(script: str, timeout: float) -> dict:
    """Runs ``script`` in a fresh interpreter (bounded by ``timeout``) and returns its ``RESULT`` json."""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                            env=keras2_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_zero_stage_holds_its_share_and_trains_as_stage_0_and_one_device():
    import numpy as np

    out = run_dtensor_script(_SCRIPT, timeout=560)
    for key in ("adamw_global_clip", "sgd_clip"):
        stage0 = out[f"{key}/0"]
        for zero in range(4):
            row = out[f"{key}/{zero}"]
            assert len(row["steps"]) == 5, (key, zero)
            assert max(abs(a - b) for a, b in zip(row["steps"], row["ref_steps"])) < 1e-5, (key, zero, row["steps"])
            assert row["ref_diff"] < 1e-5, (key, zero, row["ref_diff"])
            assert max(float(np.abs(np.array(a) - np.array(b)).max())
                       for a, b in zip(row["weights"], stage0["weights"])) < 1e-6, (key, zero)
    adamw = [out[f"adamw_global_clip/{zero}"] for zero in range(4)]
    # Elements per device (all 4 alike): embed 16x8, h 32x16 [-,m] + 16 [m], ln 2x16, o 16x8 [-,m] + 8 [m].
    # ZeRO splits each over b on its first whole axis: all but the biases already split over m.
    whole, split = 128 + 256 + 8 + 32 + 64 + 4, 64 + 128 + 8 + 16 + 32 + 4
    assert [row["held"]["parameters"] for row in adamw] == [[whole] * 4] * 3 + [[split] * 4]
    assert [row["held"]["gradients"] for row in adamw] == [[whole] * 4] * 2 + [[split] * 4] * 2
    assert [row["held"]["optimizer_state"] for row in adamw] == [[2 * whole + 1] * 4] + [[2 * split + 1] * 4] * 3
    # The planner, from the mesh's layout decisions, predicts each exactly (but for Adam's step counter).
    for row in adamw:
        assert row["planned"] == {"parameters": row["held"]["parameters"][0], "gradients": row["held"]["gradients"][0],
                                  "optimizer_state": row["held"]["optimizer_state"][0] - 1}
    assert adamw[0]["layouts"]["h/kernel:0"] == adamw[2]["layouts"]["h/kernel:0"] == ["unsharded", "m"]
    assert adamw[3]["layouts"]["h/kernel:0"] == ["b", "m"] and adamw[3]["layouts"]["h/bias:0"] == ["m"]
    assert adamw[3]["layouts"]["embed/embeddings:0"] == ["b", "unsharded"]
    assert adamw[3]["zero_variables"] == ["embed/embeddings:0", "h/kernel:0", "ln/beta:0", "ln/gamma:0", "o/kernel:0"]
    assert not adamw[2]["zero_variables"]
    assert adamw[0]["slots"]["AdamW/m/h/kernel:0"] == ["unsharded", "m"]
    assert all(row["slots"]["AdamW/v/h/kernel:0"] == ["b", "m"] for row in adamw[1:])
    assert all(row["slots"]["AdamW/m/embed/embeddings:0"] == ["b", "unsharded"] for row in adamw[1:])
    assert [row["grads"]["h/kernel:0"] for row in adamw] == [["unsharded", "m"]] * 2 + [["b", "m"]] * 2
    assert [row["grads"]["ln/gamma:0"] for row in adamw] == [["unsharded"]] * 2 + [["b"]] * 2


def test_zero_stages_beyond_3_are_refused():
    with pytest.raises(ValueError, match=r"^zero must be an integer from 0 to 3. Received: zero=4$"):
        Mesh("b:2;m:2", "batch:b;hidden:m", zero=4)


def test_weight_splits_before_a_scope_is_a_clear_error():
    from tensorfleet.compat.keras import keras2

    tf_keras = keras2()
    with pytest.raises(ValueError, match=r"^Build the model inside mesh.scope\(\) first.*Received: model 'm' and no "
                                         r"scope entered$"):
        Mesh("b:2", "batch:b").weight_splits(tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(2)],
                                                                 name="m"))
