"""Keras 3 models on the edge: every conversion mode, TFLite Micro, the report, C export and decomposition,
against the same model in tf_keras (its twin: the same weights, copied across)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorfleet import edge, testing
from tensorfleet.compat.keras import Keras, keras_of
from tests.edge.conftest import MODES, full_rank, kinds_model

EPS32 = float(np.finfo(np.float32).eps)
DIGITS_OPS = ("CONV_2D", "CONV_2D", "MAX_POOL_2D", "RESHAPE", "FULLY_CONNECTED", "FULLY_CONNECTED")


def builtins_only(artifact: Any) -> None:
    """No custom and no Flex (SELECT_TF_OPS) operator: what a microcontroller can run."""
    odd = [op.op for op in artifact.graph.operators if op.custom or op.op.startswith("Flex")]
    assert odd == [], odd


@pytest.fixture(scope="module")
def twin(keras3: Any, digits_model: Any) -> Any:
    """The zoo's digits CNN built in Keras 3, holding the trained tf_keras model's weights."""
    from tensorfleet import models

    model = models.build("digits_cnn", keras="keras3")
    model.set_weights(digits_model.get_weights())
    return model


@pytest.fixture(scope="module")
def twin_artifacts(twin: Any, digits: Any) -> dict[str, Any]:
    return {mode: edge.convert(twin, mode, digits.x_train, num_calibration_samples=50, progress=False)
            for mode in MODES}


def test_every_mode_converts_a_keras3_model_to_the_ops_of_its_tf_keras_twin(
        twin: Any, twin_artifacts: dict[str, Any], digits_artifacts: dict[str, Any]) -> None:
    assert keras_of(twin) is Keras.KERAS3
    for mode in MODES:
        mine, theirs = twin_artifacts[mode], digits_artifacts[mode]
        builtins_only(mine)
        assert mine.quantization == mode
        assert mine.ops == theirs.ops, mode  # Keras 3's Flatten folds into one RESHAPE, as tf_keras's does
        assert [(t.dtype, t.shape) for t in mine.inputs + mine.outputs] == \
               [(t.dtype, t.shape) for t in theirs.inputs + theirs.outputs], mode
        assert abs(mine.size - theirs.size) <= 0.01 * theirs.size, (mode, mine.size, theirs.size)
    assert twin_artifacts["int8"].ops == DIGITS_OPS
    assert twin_artifacts["int8"].inputs[0].scales == digits_artifacts["int8"].inputs[0].scales
    assert twin_artifacts["int8"].inputs[0].zero_points == (-128,)


@pytest.mark.slow
def test_int8_on_tflite_micro_is_as_accurate_and_as_small_as_the_tf_keras_twin(
        twin_artifacts: dict[str, Any], digits_artifacts: dict[str, Any], digits: Any) -> None:
    mine = edge.validate_micro(twin_artifacts["int8"], digits.x_test, digits.y_test, progress=False)
    theirs = edge.validate_micro(digits_artifacts["int8"], digits.x_test, digits.y_test, progress=False)
    assert mine.micro_accuracy > 0.9
    assert abs(mine.micro_accuracy - theirs.micro_accuracy) <= 0.005
    assert abs(mine.arena_bytes - theirs.arena_bytes) <= 0.05 * theirs.arena_bytes
    assert mine.keras_accuracy == pytest.approx(theirs.keras_accuracy, abs=1 / len(digits.y_test))
    assert mine.agreement_with_keras >= 0.98  # the source model here is the Keras 3 one


@pytest.mark.slow
def test_float32_tflite_computes_what_the_keras3_model_does_and_tflm_runs_it(twin: Any, twin_artifacts: dict[str, Any],
                                                            digits: Any) -> None:
    from tensorfleet.edge.micro import run_tflite

    x = digits.x_test[:32]
    expected = twin.predict(x, verbose=0)
    got = run_tflite(twin_artifacts["float32"], x)
    np.testing.assert_allclose(got, expected, rtol=0, atol=64 * EPS32 * np.abs(expected).max())
    for mode in ("float32", "int16x8"):  # the other modes TFLite Micro runs
        micro = edge.validate_micro(twin_artifacts[mode], x, digits.y_test[:32], progress=False)
        assert micro.arena_bytes > 0 and micro.agreement_with_keras == 1.0, (mode, micro)


def test_a_keras3_file_converts_and_loads_in_keras3(twin: Any, digits: Any, tmp_path: Path) -> None:
    saved = tmp_path / "k3.keras"
    twin.save(saved)
    loaded = edge.load_keras_model(saved)
    assert keras_of(loaded) is Keras.KERAS3
    artifact = edge.convert(str(saved), "int8", digits.x_train, num_calibration_samples=50, progress=False)
    assert artifact.ops == DIGITS_OPS
    builtins_only(artifact)


def test_batchnorm_dropout_reshape_in_keras3_fold_to_builtins(keras3: Any) -> None:
    from tensorfleet.edge.micro import run_tflite

    layers = keras3.layers
    model = keras3.Sequential([keras3.Input((6, 6, 2)), layers.Conv2D(4, 3, name="c"), layers.BatchNormalization(),
                               layers.ReLU(), layers.Dropout(0.5), layers.Reshape((4, 16)), layers.Flatten(),
                               layers.Dense(3)], name="bn")
    rng = np.random.default_rng(5)
    for weight in model.weights:  # BatchNorm's moving statistics too, so that folding it is checked
        weight.assign(np.abs(rng.normal(size=weight.shape)) + 0.1)
    x = rng.normal(size=(4, 6, 6, 2)).astype(np.float32)
    artifact = edge.convert(model, "float32", progress=False)
    assert artifact.ops == ("CONV_2D", "RESHAPE", "FULLY_CONNECTED")  # BN and ReLU fold into the conv
    expected = model.predict(x, verbose=0)  # Dropout is off outside training, in TFLite too
    np.testing.assert_allclose(run_tflite(artifact, x), expected, rtol=0, atol=64 * EPS32 * np.abs(expected).max())
    int8 = edge.convert(model, "int8", x, progress=False)
    builtins_only(int8)
    assert [t.dtype for t in int8.inputs + int8.outputs] == ["int8", "int8"]


def test_a_keras3_object_that_is_no_model_or_has_no_inputs_is_one_clear_error(keras3: Any) -> None:
    with pytest.raises(TypeError, match=r"^tfl\.edge\.convert takes a Keras model \(Keras 3 or tf_keras\)\. "
                                        r"Received: Dense$"):
        edge.convert(keras3.layers.Dense(2), "float32", progress=False)

    class Subclassed(keras3.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras3.layers.Dense(3)

        def call(self, x: Any) -> Any:
            return self.dense(x)

    model = Subclassed()
    model(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"^tfl\.edge\.convert needs the input shape of a Keras 3 model, and "
                                         r"'Subclassed' \(a subclassed model\) has no inputs of its own\. Wrap it in a "
                                         r"functional model: `inputs = keras\.Input\(shape\); keras\.Model\(inputs, "
                                         r"model\(inputs\)\)`\. Received: .*Subclassed with inputs=None$"):
        edge.convert(model, "int8", np.zeros((4, 4), np.float32), progress=False)
    inputs = keras3.Input((4,))
    wrapped = keras3.Model(inputs, model(inputs))
    assert edge.convert(wrapped, "float32", progress=False).ops == ("FULLY_CONNECTED",)


@pytest.mark.parametrize("method", ["svd", "tucker2", "cp"])
def test_decompose_keeps_a_keras3_model_in_keras3_and_its_outputs(keras3: Any, method: str) -> None:
    import tf_keras

    model = kinds_model(keras3)
    twin = kinds_model(tf_keras)
    twin.set_weights(model.get_weights())
    rank = full_rank(model, method)
    with testing.allow_growth():
        plans = [edge.plan_decomposition(m, method, rank=rank, energy=None if rank else 1.0) for m in (model, twin)]
    assert plans[0].as_dict() == plans[1].as_dict()  # the same plan, ranks, parameters and FLOPs in either Keras
    small = edge.decompose(model, plan=plans[0])
    assert keras_of(small) is Keras.KERAS3
    names = [[layer.name for layer in m.layers] for m in (small, edge.decompose(twin, plan=plans[1]))]
    assert names[0] == names[1]
    images = np.random.default_rng(2).normal(size=(6, 12, 12, 5)).astype(np.float32)
    expected = np.asarray(model(images))
    # float32 sums of a few hundred terms taken in another order: a few hundred eps of the largest output.
    np.testing.assert_allclose(np.asarray(small(images)), expected, rtol=0, atol=256 * EPS32 * np.abs(expected).max())
    artifact = edge.convert(small, "int8", images, progress=False)
    builtins_only(artifact)
    ops = Counter(artifact.ops)
    factored = {"svd": (2 + 2, 0), "tucker2": (3 + 3 + 2, 0), "cp": (2 + 2 + 2, 4)}[method]
    # strided and dilated: their factors (svd leaves them whole); pointwise: 2; the depthwise layer stays
    assert (ops["CONV_2D"], ops["DEPTHWISE_CONV_2D"] - 1) == factored, ops
    assert ops["FULLY_CONNECTED"] == 4


def test_decompose_a_keras3_sequential_model_and_save_it(keras3: Any, tmp_path: Path) -> None:
    from tensorfleet.compat.keras import saved_keras
    from tensorfleet.edge.decompose import save_keras

    model = keras3.Sequential([keras3.Input((10,)), keras3.layers.Dense(8, activation="tanh", name="a"),
                               keras3.layers.Dense(4, name="b")], name="seq")
    rng = np.random.default_rng(3)
    for weight in model.weights:
        weight.assign(rng.normal(scale=0.5, size=weight.shape))
    with testing.allow_growth():
        small = edge.decompose(model, "svd", energy=1.0)
    assert isinstance(small, keras3.Sequential)
    assert [layer.name for layer in small.layers] == ["a_u", "a_v", "b_u", "b_v"]
    x = rng.normal(size=(5, 10)).astype(np.float32)
    expected = np.asarray(model(x))
    np.testing.assert_allclose(np.asarray(small(x)), expected, rtol=0, atol=64 * EPS32 * np.abs(expected).max())
    path = save_keras(small, tmp_path / "small.keras")
    assert saved_keras(path) is Keras.KERAS3
    assert edge.convert(str(path), "float32", progress=False).ops == (
        "FULLY_CONNECTED", "FULLY_CONNECTED", "TANH", "FULLY_CONNECTED", "FULLY_CONNECTED")


def test_a_keras3_model_with_named_inputs_converts_with_a_batch_of_one(keras3: Any) -> None:
    a, b = keras3.Input((4,), name="a"), keras3.Input((2,), name="b")
    model = keras3.Model({"a": a, "b": b}, keras3.layers.Dense(2)(keras3.layers.Concatenate()([a, b])))
    artifact = edge.convert(model, "float32", progress=False)
    assert artifact.ops == ("CONCATENATION", "FULLY_CONNECTED")
    assert sorted((t.name, t.shape) for t in artifact.inputs) == [("serving_default_a:0", (1, 4)),
                                                                 ("serving_default_b:0", (1, 2))]


@pytest.mark.slow
def test_a_keras3_model_saved_with_pruning_wrappers_converts_from_the_command_line_in_a_new_process(tmp_path):
    import subprocess
    import sys

    # Saved here (the suite's process is a user's default one, conftest.py), loaded in a new process: what the
    # command needs is that a fresh process knows the wrappers; one process start instead of two.
    from tensorfleet import models
    from tests.conftest import user_env

    edge.optimize.apply_pruning(models.build("digits_cnn", keras="keras3"), sparsity=0.5).save(
        tmp_path / "wrapped.keras")
    done = subprocess.run([sys.executable, "-m", "tensorfleet", "edge", "convert", "wrapped.keras", "--quantization",
                           "float32", "--out", "m.tflite"], cwd=tmp_path, env=user_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "m.tflite").read_bytes()[4:8] == b"TFL3"


def _lstm(keras: Any, *, unroll: bool, bidirectional: bool = False) -> Any:
    recurrent = keras.layers.LSTM(8, unroll=unroll, name="lstm")
    layer = keras.layers.Bidirectional(recurrent, name="both") if bidirectional else recurrent
    return keras.Sequential([keras.Input((10, 4)), layer, keras.layers.Dense(3)])


def test_a_recurrent_loop_is_refused_for_full_integer_modes_and_unrolled_converts(keras3: Any) -> None:
    # TensorFlow 2.21's converter ended the process (SIGSEGV, exit 139) calibrating a Keras 3 LSTM's WHILE loop.
    samples = np.random.default_rng(0).normal(size=(20, 10, 4)).astype("float32")
    for mode in ("int8", "int16x8"):
        with pytest.raises(edge.QuantizationError) as refused:
            edge.convert(_lstm(keras3, unroll=False), mode, samples, progress=False)
        assert str(refused.value) == (
            f"quantization={mode!r} cannot convert a recurrent layer that loops over its time steps: LSTM 'lstm' "
            "(TensorFlow's converter crashes calibrating the loop). Build the recurrent layer with unroll=True (its "
            "time steps become plain operators; the sequence length must be fixed), or use 'dynamic', 'float16' or "
            "'float32'.")
    with pytest.raises(edge.QuantizationError, match=r"loops over its time steps: Bidirectional 'both'|LSTM 'forward"):
        edge.convert(_lstm(keras3, unroll=False, bidirectional=True), "int8", samples, progress=False)
    assert "WHILE" in edge.convert(_lstm(keras3, unroll=False), "dynamic", progress=False).op_types
    # Unrolled, it converts; not verified: TensorFlow 2.21's converter leaves its SPLIT in float32 in about one
    # conversion in four (the same model, seeds and data), which verify_int8 then names.
    unrolled = edge.convert(_lstm(keras3, unroll=True), "int8", samples, progress=False, verify=False)
    assert unrolled.inputs[0].dtype == "int8" and "WHILE" not in unrolled.op_types


def test_a_tf_keras_recurrent_loop_fails_with_the_remedy_for_a_microcontroller() -> None:
    from tensorfleet.compat.keras import keras2

    with pytest.raises(edge.QuantizationError) as failed:
        edge.convert(_lstm(keras2(), unroll=False), "float32", progress=False)
    assert str(failed.value) == (
        "The TFLite converter failed for quantization='float32': LSTM 'lstm' loops over its time steps with tensor "
        "lists, which TFLite's builtin operators cannot lower: build the recurrent layer with unroll=True (its time "
        "steps become plain operators; the sequence length must be fixed)")
    assert "FULLY_CONNECTED" in edge.convert(_lstm(keras2(), unroll=True), "float32", progress=False).op_types
