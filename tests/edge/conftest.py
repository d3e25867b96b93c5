"""Shared, cached fixtures for the edge tests: one trained digits CNN and its conversions.

Conversions take about a second each on this machine, so every artifact is made once per
session and shared by the test modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

MODES = ("float32", "dynamic", "float16", "int8", "int16x8")


@pytest.fixture(scope="session")
def digits_model(digits: Any) -> Any:

    from tensorfleet import models

    tf_keras.utils.set_random_seed(0)
    model = models.build("digits_cnn")
    model.compile(optimizer="adam", loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(digits.x_train, digits.y_train, epochs=3, batch_size=32, verbose=0)
    return model


@pytest.fixture(scope="session")
def digits_artifacts(digits_model: Any, digits: Any) -> dict[str, Any]:
    from tensorfleet import edge

    return {mode: edge.convert(digits_model, mode, digits.x_train, num_calibration_samples=50, progress=False)
            for mode in MODES}




def kinds_model(keras: Any) -> Any:
    """Every layer kind decompose meets, with bias, 'same'/'valid' padding, strides and dilation, in a functional
    graph built in ``keras`` (a Keras module), its weights drawn from N(0, 0.5^2) with seed 1."""
    layers = keras.layers
    inputs = keras.Input((12, 12, 5), name="image")
    x = layers.Conv2D(6, 3, strides=2, padding="same", activation="relu", name="strided")(inputs)
    x = layers.Conv2D(7, (3, 2), dilation_rate=2, padding="valid", name="dilated")(x)
    x = layers.Conv2D(4, 1, padding="same", use_bias=False, name="pointwise")(x)
    x = layers.DepthwiseConv2D(3, padding="same", name="depthwise")(x)
    x = layers.Flatten(name="flat")(x)
    x = layers.Dense(9, activation="relu", name="hidden")(x)
    model = keras.Model(inputs, layers.Dense(3, name="logits")(x), name="kinds")
    rng = np.random.default_rng(1)
    for weight in model.weights:
        weight.assign(rng.normal(scale=0.5, size=weight.shape))
    return model


def full_rank(model: Any, method: str) -> Any:
    """The ranks at which every factored form of :func:`kinds_model` is exact: cp's by layer, None (energy 1.0)
    for svd and tucker2."""
    from tensorfleet.edge.decompose_factors import cp_full_rank

    if method != "cp":
        return None
    return {layer.name: cp_full_rank(tuple(layer.kernel.shape)) if layer.kernel.shape[0] > 1 else 4
            for layer in model.layers if type(layer).__name__ == "Conv2D"} | {"hidden": 9, "logits": 3}


@pytest.fixture(scope="session")
def int8_artifact(digits_artifacts: dict[str, Any]) -> Any:
    return digits_artifacts["int8"]


@pytest.fixture(scope="session")
def sine_path() -> Path:
    import tflite_micro

    path = Path(tflite_micro.__file__).parent / "python" / "tflite_micro" / "sine_float.tflite"
    assert path.is_file()
    return path


@pytest.fixture(scope="session")
def topk_artifact() -> Any:
    """A float model whose TOPK_V2 op TFLite Micro has no kernel for."""
    import tensorflow as tf

    from tensorfleet import edge

    inputs = tf_keras.Input((8,))
    values, _ = tf.math.top_k(inputs, k=3)
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(2)(values))
    return edge.convert(model, "float32", progress=False)


def pack_model(model: Any) -> bytes:
    """A TFLite flatbuffer from a ``schema_py_generated.ModelT`` (the schema the TFLM wheel ships)."""
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


SIGNAL_WINDOW = np.array([4096, 2048, 1024, 512, 256, 128, 64, 32], np.int16)  # Q12 weights: 1, 1/2, ... 1/128


@pytest.fixture(scope="session")
def signal_window_artifact() -> Any:
    """A one-operator model of TFLM's Signal library, as its audio front end uses it: SignalWindow
    multiplies int16 samples by int16 weights and shifts right by 12 (signal/micro/kernels/window.cc)."""
    from flatbuffers import flexbuffers
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as fb

    from tensorfleet import edge

    code = fb.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = fb.BuiltinOperator.CUSTOM
    code.customCode, code.version = "SignalWindow", 1
    tensors = []
    for index, name in enumerate(("audio", "window", "windowed")):
        tensor = fb.TensorT()
        tensor.shape = [len(SIGNAL_WINDOW)] if name == "window" else [1, len(SIGNAL_WINDOW)]
        tensor.type, tensor.name, tensor.buffer = fb.TensorType.INT16, name, 1 if name == "window" else 0
        tensors.append(tensor)
    op = fb.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1], [2]
    op.customOptions = list(flexbuffers.Dumps({"shift": 12}))
    subgraph = fb.SubGraphT()
    subgraph.tensors, subgraph.inputs, subgraph.outputs, subgraph.operators = tensors, [0], [2], [op]
    weights = fb.BufferT()
    weights.data = list(SIGNAL_WINDOW.tobytes())
    model = fb.ModelT()
    model.version, model.operatorCodes, model.subgraphs = 3, [code], [subgraph]
    model.buffers = [fb.BufferT(), weights]
    return edge.TFLiteArtifact.from_bytes(pack_model(model))


@pytest.fixture(scope="session")
def lstm_int8_artifact() -> Any:
    """A small Keras LSTM (10 steps of 4 features -> 8 units -> 3 classes), full-int8."""

    from tensorfleet import edge

    tf_keras.utils.set_random_seed(0)
    inputs = tf_keras.Input((10, 4), batch_size=1)
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(3)(tf_keras.layers.LSTM(8)(inputs)))
    data = np.random.default_rng(0).normal(size=(40, 10, 4)).astype(np.float32)
    return edge.convert(model, "int8", data, progress=False)


@pytest.fixture(scope="session")
def kws_int16_input_artifact() -> Any:
    """A keyword-spotting-shaped int8 conv model that takes int16 features, as a front end gives them.

    TF's converter offers only float, int8 and uint8 inputs, so the model is converted with a uint8
    input (a QUANTIZE op in front of the int8 graph) and that input is made int16 (zero point 0):
    TFLM's QUANTIZE requantizes int16 to int8.
    """
    import tensorflow as tf
    from tflite_micro.python.tflite_micro import runtime
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as fb

    from tensorfleet import edge

    tf_keras.utils.set_random_seed(0)
    layers = tf_keras.layers
    inputs = tf_keras.Input((49, 10, 1))
    x = layers.Conv2D(8, (10, 4), strides=2, padding="same", activation="relu")(inputs)
    x = layers.DepthwiseConv2D(3, padding="same", activation="relu")(x)
    outputs = layers.Dense(4, activation="softmax")(layers.GlobalAveragePooling2D()(x))
    data = np.random.default_rng(0).normal(size=(20, 49, 10, 1)).astype(np.float32)

    def representative() -> Any:
        for sample in data:
            yield [sample[None]]

    converter = tf.lite.TFLiteConverter.from_keras_model(tf_keras.Model(inputs, outputs))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type, converter.inference_output_type = tf.uint8, tf.int8
    model = runtime.convert_bytearray_to_object(bytearray(converter.convert()))
    features = model.subgraphs[0].tensors[model.subgraphs[0].inputs[0]]
    features.type = fb.TensorType.INT16
    features.quantization.zeroPoint = [0]
    return edge.TFLiteArtifact.from_bytes(pack_model(model))
