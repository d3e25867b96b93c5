"""Layers a DTensor mesh computes in ops of its own (keras_layers): DepthwiseConv2D split along channels,
Dense over sequences split along units, Dropout drawing one device's mask; each equal to one device."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet.compat.keras import keras2
from tensorfleet.model_parallel.mesh import KerasLayout
from tensorfleet.model_parallel.mesh.keras_layers import Adaptation, adapt_split_readers, adaptation, depthwise_conv2d
from tensorfleet.model_parallel.mesh.keras_layout import WeightLayout
from tests.conftest import keras2_env

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

_layers = tf_keras.layers


def _run_result(script: str, *, timeout: float) -> dict:
    """Runs ``script`` in a fresh interpreter (DTensor cannot share the suite's process): its RESULT json."""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                            env=keras2_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])


def _depthwise_reference(x: np.ndarray, k: np.ndarray, strides, padding: str,
                         dilation) -> tuple[np.ndarray, np.ndarray]:
    """``tf.nn.depthwise_conv2d`` from its documented definition, in float64 numpy (every CPU computes it alike;
    TensorFlow's own kernel refuses unequal strides on some CPUs): ``output[b, i, j, c * multiplier + q] =
    sum over di, dj of padded[b, i * sh + di * dh, j * sw + dj * dw, c] * k[di, dj, c, q]``, with SAME's padding
    ``max((out - 1) * s + (k - 1) * d + 1 - in, 0)``, its odd pixel after. Also returns the sum of the terms'
    magnitudes, which bounds float32 rounding."""
    (kh, kw, channels, multiplier), (sh, sw), (dh, dw) = k.shape, strides, dilation
    height, width = x.shape[1:3]
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if padding == "same":
        out_h, out_w = -(-height // sh), -(-width // sw)
        pad_h, pad_w = max((out_h - 1) * sh + span_h - height, 0), max((out_w - 1) * sw + span_w - width, 0)
        x = np.pad(x, [(0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)])
    else:
        out_h, out_w = (height - span_h) // sh + 1, (width - span_w) // sw + 1
    x, k = x.astype(np.float64), k.astype(np.float64)
    out = np.zeros((x.shape[0], out_h, out_w, channels * multiplier))
    magnitude = np.zeros_like(out)
    for i in range(out_h):
        for j in range(out_w):
            window = x[:, i * sh:i * sh + span_h:dh, j * sw:j * sw + span_w:dw, :]  # (batch, kh, kw, channels)
            terms = window[..., None] * k[None]  # (batch, kh, kw, channels, multiplier)
            out[:, i, j] = terms.sum(axis=(1, 2)).reshape(x.shape[0], -1)
            magnitude[:, i, j] = np.abs(terms).sum(axis=(1, 2)).reshape(x.shape[0], -1)
    return out, magnitude


@pytest.mark.parametrize("kernel,strides,padding,dilation,multiplier", [
    ((3, 3), (1, 1), "same", (1, 1), 1),
    ((3, 3), (2, 2), "valid", (1, 1), 2),
    ((5, 3), (2, 1), "same", (1, 1), 3),
    ((3, 3), (1, 1), "same", (2, 2), 1),
    ((2, 2), (2, 2), "same", (1, 1), 1),
])
def test_depthwise_as_slices_equals_the_definition_of_a_depthwise_convolution(kernel, strides, padding, dilation,
                                                                              multiplier):
    rng = np.random.RandomState(0)
    x = rng.randn(2, 9, 8, 4).astype("float32")
    k = rng.randn(*kernel, 4, multiplier).astype("float32")
    want, magnitude = _depthwise_reference(x, k, strides, padding, dilation)
    got = depthwise_conv2d(tf.constant(x), tf.constant(k), strides, padding, dilation).numpy()
    assert got.shape == want.shape
    # float32 products and a sum of kh * kw of them: each step rounds by at most 2**-24 of what it holds.
    bound = (kernel[0] * kernel[1] + 1) * 2.0**-24 * magnitude
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) - bound)


def test_depthwise_kernels_and_sequence_dense_layers_split_by_the_rules():
    layout = KerasLayout({"b": 2, "m": 2}, {"batch": "b", "hidden": "m", "channels": "m"})
    depthwise = _layers.DepthwiseConv2D(3, depth_multiplier=2, name="dw")
    assert layout.weight(depthwise, "dw/depthwise_kernel", "depthwise_kernel", (3, 3, 8, 2)).mesh_axes == (
        None, None, "m", None)
    assert layout.weight(depthwise, "dw/bias", "bias", (16,)).mesh_axes == ("m",)
    sequence = layout.weight(_layers.Dense(16, name="up"), "up/kernel", "kernel", (8, 16), input_rank=3)
    assert sequence.mesh_axes == (None, "m") and sequence.note == ""
    first = _layers.DepthwiseConv2D(3, data_format="channels_first", name="nchw")
    kept = layout.weight(first, "nchw/depthwise_kernel", "depthwise_kernel", (3, 3, 8, 1))
    assert kept.mesh_axes == (None,) * 4 and kept.note.startswith("convolution kernels stay replicated")



def _decided(model, split):
    """Each weight of ``model`` laid out as on a ``b:2;m:2`` mesh whose rules split the units of the
    layers named in ``split``."""
    return [WeightLayout(w.name.split(":")[0], tuple(w.shape),
                         (None,) * (len(w.shape) - 1) + ("m" if w.name.split("/")[0] in split else None,))
            for w in model.weights]


def test_the_trainer_adapts_exactly_the_pools_and_concatenations_that_read_split_units():
    tokens = tf_keras.Input((12,), dtype="int32")
    e = _layers.Embedding(50, 8, name="embed")(tokens)
    h = _layers.Flatten(name="f1")(_layers.MaxPooling1D(3, name="pool")(_layers.Dense(16, name="up")(e)))
    side = _layers.Flatten(name="f2")(_layers.LayerNormalization(name="ln")(_layers.Dense(4, name="side")(e)))
    whole = _layers.Flatten(name="f3")(_layers.AveragePooling1D(2, name="avg")(e))
    h = _layers.Concatenate(name="cat")([_layers.Concatenate(name="cat_whole")([h, whole]), side])
    text = tf_keras.Model(tokens, _layers.Dense(5, name="head")(h))
    mesh = "dtensor mesh"  # only stored on the adapted layers; nothing runs here
    assert adapt_split_readers(text, _decided(text, {"up", "side"}), "b", mesh) == ["pool", "cat"]
    assert adaptation(text.get_layer("pool")) == Adaptation("b", mesh) and adaptation(text.get_layer("avg")) is None
    # a CNN's pools read convolutions (filters whole) and a Dense split along the batch alone: none adapted
    pixels = tf_keras.Input((8, 8, 1))
    a = _layers.Conv2D(8, 3, padding="same", name="conv")(pixels)
    h = _layers.MaxPooling2D(name="max")(_layers.Concatenate(name="both")([a, _layers.Conv2D(8, 1, name="pw")(a)]))
    cnn = tf_keras.Model(pixels, _layers.Dense(10, name="d1")(_layers.GlobalAveragePooling2D()(h)))
    decided = [WeightLayout(w.path, w.shape, ("b",) * len(w.shape)) for w in _decided(cnn, set())]
    assert adapt_split_readers(cnn, decided, "b", mesh) == []
    # a Sequential: Dense with split units, Reshape, then pooling
    chain = tf_keras.Sequential([tf_keras.Input((8,)), _layers.Dense(16, name="wide"), _layers.Reshape((4, 4)),
                                 _layers.MaxPooling1D(2, name="seq_pool"), _layers.Flatten(), _layers.Dense(3)])
    assert adapt_split_readers(chain, _decided(chain, {"wide"}), "b", mesh) == ["seq_pool"]

_SCRIPT = r"""
import json
import numpy as np
from tensorfleet.strategies.devices import simulate_devices
simulate_devices(4)
import tensorflow as tf
from tensorfleet.model_parallel.mesh import Mesh
L = tf.keras.layers

def build():  # DepthwiseConv2D (multiplier 1 and 2, SAME and strided), Dense over a sequence, Dropout 0.3
    tf.keras.utils.set_random_seed(3)
    pixels = tf.keras.Input((8, 8, 4))
    h = L.Concatenate()([pixels, L.Conv2D(4, 1, name="pw")(pixels)])
    h = L.DepthwiseConv2D(3, padding="same", activation="relu", name="dw")(h)
    h = L.DepthwiseConv2D(3, strides=2, depth_multiplier=2, name="dw2")(h)
    h = L.Reshape((9, 16))(h)
    h = L.Dropout(0.3, seed=5, name="drop")(L.Dense(16, activation="gelu", name="up")(h))
    h = L.GlobalAveragePooling1D()(L.Dense(8, name="down")(h))
    return tf.keras.Model(pixels, L.Dense(10, name="out")(h))

class Steps(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.losses = getattr(self, "losses", []) + [float(logs["loss"])]

x = np.random.RandomState(0).rand(64, 8, 8, 4).astype("float32")
y = np.arange(64) % 10
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
tf.keras.backend.experimental.enable_tf_random_generator()  # one device draws Dropout's masks as the mesh does
reference = build()
initial = reference.get_weights()
reference.compile(tf.keras.optimizers.Adam(1e-2), loss)
ref_steps = Steps()
reference.fit(x, y, batch_size=16, shuffle=False, verbose=0, callbacks=[ref_steps])
mesh = Mesh("b:2;m:2", "batch:b;hidden:m;channels:m")
with mesh.scope() as layout:
    model = build()
    model.compile(tf.keras.optimizers.Adam(1e-2), loss)
model.set_weights(initial)
steps = Steps()
model.fit(x, y, batch_size=16, shuffle=False, verbose=0, callbacks=[steps])
print("RESULT " + json.dumps({
    "steps": steps.losses, "ref_steps": ref_steps.losses,
    "weight_diff": float(max(np.abs(a - b).max() for a, b in zip(model.get_weights(), reference.get_weights()))),
    "moved": float(max(np.abs(a - b).max() for a, b in zip(reference.get_weights(), initial))),
    "layouts": {w.path: [a or "-" for a in w.mesh_axes] for w in layout.decided}}))
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_depthwise_sequence_dense_and_dropout_train_on_a_2x2_mesh_as_on_one_device():
    out = _run_result(_SCRIPT, timeout=380)
    assert len(out["steps"]) == 4 and out["moved"] > 1e-3
    # the same losses (so the same dropout masks) and weights as one device after 4 Adam steps
    assert max(abs(a - b) for a, b in zip(out["steps"], out["ref_steps"])) < 1e-6, out
    assert out["weight_diff"] < 1e-6, out["weight_diff"]
    layouts = out["layouts"]
    assert layouts["dw/depthwise_kernel"] == ["-", "-", "m", "-"] and layouts["dw2/bias"] == ["m"]
    assert layouts["pw/kernel"] == ["-"] * 4  # a Conv2D's filter stays whole (note), the depthwise ones split
    assert layouts["up/kernel"] == ["-", "m"] and layouts["down/bias"] == ["m"] and layouts["drop/StateVar"] == ["-"]


_POOLING_SCRIPT = r"""
import json
import numpy as np
from tensorfleet.strategies.devices import simulate_devices
simulate_devices(4)
import tensorflow as tf
from tensorfleet.model_parallel.mesh import Mesh
L = tf.keras.layers

def build():  # pooling and Concatenate reading a Dense over a sequence whose units are split
    tf.keras.utils.set_random_seed(3)
    tokens = tf.keras.Input((8,), dtype="int32")
    h = L.Dense(16, activation="relu", name="up")(L.Embedding(32, 8, name="embed")(tokens))
    h = L.Concatenate(name="both")([L.MaxPooling1D(2, name="max")(h), L.AveragePooling1D(2, name="avg")(h)])
    return tf.keras.Model(tokens, L.Dense(10, name="out")(L.Flatten()(h)))

x = np.random.RandomState(0).randint(0, 32, (64, 8)).astype("int32")
y = x.sum(axis=1) % 10
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
reference = build()
initial = reference.get_weights()
reference.compile(tf.keras.optimizers.Adam(1e-2), loss)
ref_loss = reference.fit(x, y, batch_size=16, shuffle=False, verbose=0).history["loss"]
mesh = Mesh("b:2;m:2", "batch:b;hidden:m")
with mesh.scope(patterns={"embed/embeddings": (None, "m")}) as layout:  # the table's columns split
    model = build()
    model.compile(tf.keras.optimizers.Adam(1e-2), loss)
adapted = sorted(model.mesh_trainer.adapted)  # the trainer adapts the layers reading split units, nothing else
model.set_weights(initial)
mesh_loss = model.fit(x, y, batch_size=16, shuffle=False, verbose=0).history["loss"]
print("RESULT " + json.dumps({
    "loss": mesh_loss, "ref_loss": ref_loss, "adapted": adapted,
    "weight_diff": float(max(np.abs(a - b).max() for a, b in zip(model.get_weights(), reference.get_weights()))),
    "layouts": {w.path: w.mesh_axes for w in layout.decided}}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pooling_and_concatenate_of_split_units_and_a_column_split_embedding_train_as_on_one_device():
    out = _run_result(_POOLING_SCRIPT, timeout=280)
    assert out["adapted"] == ["avg", "max"]  # "both" reads the pools' outputs, split along the batch alone
    assert out["layouts"]["up/kernel"] == [None, "m"] and out["layouts"]["embed/embeddings"] == [None, "m"]
    assert abs(out["loss"][0] - out["ref_loss"][0]) < 1e-6 and out["weight_diff"] < 1e-5, out
