"""tfl.edge.decompose: exact factors at full rank, the plan, the .tflite keeping the factors, errors."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorfleet import edge, testing
from tensorfleet.compat.keras import keras2
from tensorfleet.edge.decompose_factors import cp_full_rank
from tests.edge.conftest import full_rank, kinds_model

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

EPS32 = float(np.finfo(np.float32).eps)


def _assign_normal(model: Any, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(scale=0.5, size=weight.shape))
    return model


@pytest.fixture(scope="module")
def conv_model() -> Any:

    return kinds_model(tf_keras)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(2).normal(size=(6, 12, 12, 5)).astype(np.float32)


@pytest.mark.parametrize("method", ["svd", "tucker2", "cp"])
def test_full_rank_factors_give_the_same_outputs(conv_model: Any, images: np.ndarray, method: str) -> None:
    rank = full_rank(conv_model, method)
    with testing.allow_growth():
        plan = edge.plan_decomposition(conv_model, method, rank=rank, energy=None if rank else 1.0)
    small = edge.decompose(conv_model, plan=plan)
    expected = conv_model(images).numpy()
    got = small(images).numpy()
    # float32 sums of a few hundred terms taken in another order: a few hundred eps of the largest output.
    np.testing.assert_allclose(got, expected, rtol=0, atol=256 * EPS32 * np.abs(expected).max())
    forms = {row.name: row.form for row in plan.decomposed}
    conv_form = {"svd": None, "tucker2": "tucker2", "cp": "cp"}[method]
    assert forms.get("strided") == conv_form and forms.get("dilated") == conv_form
    assert forms["pointwise"] == forms["hidden"] == forms["logits"] == "svd"
    assert "depthwise" not in forms
    assert [layer.name for layer in conv_model.layers if layer.name.startswith("strided")] == ["strided"]


def test_sequential_models_decompose_too() -> None:

    model = tf_keras.Sequential([tf_keras.Input((10,)), tf_keras.layers.Dense(8, activation="tanh", name="a"),
                                 tf_keras.layers.Dense(4, name="b")], name="seq")
    _assign_normal(model, 3)
    x = np.random.default_rng(4).normal(size=(5, 10)).astype(np.float32)
    with testing.allow_growth():
        small = edge.decompose(model, "svd", energy=1.0)
    assert isinstance(small, tf_keras.Sequential)
    assert [layer.name for layer in small.layers] == ["a_u", "a_v", "b_u", "b_v"]
    expected = model(x).numpy()
    np.testing.assert_allclose(small(x).numpy(), expected, rtol=0, atol=64 * EPS32 * np.abs(expected).max())


def test_plan_leaves_growing_layers_alone_with_the_reason(conv_model: Any, tmp_path: Path) -> None:
    plan = edge.plan_decomposition(conv_model, "tucker2", energy=1.0)
    rows = {row.name: row for row in plan.layers}
    assert not rows["strided"].decomposed
    assert rows["strided"].reason == "would not shrink: 276 -> 337 parameters at rank 5x6"
    assert rows["depthwise"].reason == "DepthwiseConv2D: method 'tucker2' factors Dense and Conv2D layers"
    assert rows["strided"].params_after == rows["strided"].params_before == 276
    text = plan.describe()
    assert isinstance(text, str) and "left alone: would not shrink: 276 -> 337" in text
    json.dumps(plan.as_dict())
    with pytest.raises(edge.DecompositionError, match="no layer of model 'kinds' is worth factoring"):
        edge.decompose(conv_model, plan=plan)


def test_ranks_by_energy_and_vbmf() -> None:

    rng = np.random.default_rng(0)
    low = (rng.normal(size=(40, 3)) @ rng.normal(size=(3, 30))).astype(np.float32)
    model = tf_keras.Sequential([tf_keras.Input((40,)), tf_keras.layers.Dense(30, name="d")], name="low")
    model.layers[0].kernel.assign(low + 0.01 * rng.normal(size=low.shape))
    assert edge.plan_decomposition(model, "svd", rank="vbmf").layers[0].rank == (3,)
    row = edge.plan_decomposition(model, "svd", energy=0.99).layers[0]
    assert row.rank == (3,) and row.params_after == 3 * 70 + 30 and row.macs_after == 3 * 70
    assert row.energy > 0.99


def test_cp_rank_by_energy_is_the_smallest_that_keeps_it(conv_model: Any) -> None:
    from tensorfleet.edge.decompose_factors import fit_cp, kernel_of
    from tensorfleet.edge.decompose_rank import cp_energy

    with testing.allow_growth():
        plan = edge.plan_decomposition(conv_model, "cp", energy=0.95, layers=["strided"])
    (row,) = plan.layers
    kernel = kernel_of(conv_model.get_layer("strided"))
    assert row.energy >= 0.95 and 1 < row.rank[0] < cp_full_rank(kernel.shape)
    assert cp_energy(kernel, fit_cp(kernel, row.rank[0] - 1)) < 0.95


@pytest.mark.slow
def test_the_tflite_keeps_the_factors_and_the_pipeline_runs(tmp_path: Path) -> None:
    """Fine-tune with 'decompose', convert to int8 and float32, validate on TFLM, report, export C."""

    from tensorfleet.models import datasets

    digits = datasets.load_digits()
    tf_keras.utils.set_random_seed(0)
    layers = tf_keras.layers
    inputs = tf_keras.Input((8, 8, 1))
    x = layers.Conv2D(16, 3, padding="same", activation="relu", name="c1")(inputs)
    x = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu", name="c2")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(64, activation="relu", name="fc")(x)
    model = tf_keras.Model(inputs, layers.Dense(10, name="logits")(x), name="small_cnn")
    tucker2 = edge.decompose(model, "tucker2", rank={"c2": (8, 8), "fc": 8})
    ops = Counter(op.op for op in edge.convert(tucker2, "float32", progress=False).graph.operators)
    # c1 stays one CONV_2D (its rank was not given); c2's three factors and fc's two FULLY_CONNECTED stay apart.
    assert ops == {"CONV_2D": 1 + 3, "RESHAPE": 1, "FULLY_CONNECTED": 2 + 1}
    small = edge.finetune(model, "decompose", digits.x_train[:256], digits.y_train[:256], method="cp",
                          rank={"c2": 12, "fc": 8}, epochs=1)
    qat = edge.finetune(small, "qat", digits.x_train[:64], digits.y_train[:64], epochs=1, batch_size=64)
    artifact = edge.convert(qat, "int8", digits.x_train, num_calibration_samples=20, progress=False)
    int8_ops = Counter(op.op for op in artifact.graph.operators)
    # cp: c2 is 1x1, kh x 1 depthwise, 1 x kw depthwise, 1x1 (int8 adds QUANTIZE / DEQUANTIZE at the ends).
    assert (int8_ops["CONV_2D"], int8_ops["DEPTHWISE_CONV_2D"], int8_ops["FULLY_CONNECTED"]) == (1 + 2, 2, 2 + 1)
    validation = edge.validate_micro(artifact, digits.x_test[:5])
    assert validation.arena_bytes > 0
    rep = edge.report(artifact, arena_bytes=validation.arena_bytes, measure_arena=False)
    fc = [layer for layer in rep.layers if layer.op == "FULLY_CONNECTED"]
    assert [layer.macs for layer in fc] == [512 * 8, 8 * 64, 64 * 10]
    written = edge.export_c(artifact, tmp_path / "c", "decomposed")
    assert {p.name for p in written} >= {"decomposed_model_data.cc", "decomposed_model_data.h"}


def test_bad_input_is_one_clear_error(conv_model: Any) -> None:

    with pytest.raises(edge.DecompositionError,
                       match=r"rank 10 is too large for layer 'hidden'.*at most 9 .*Received: rank=10"):
        edge.plan_decomposition(conv_model, "svd", rank={"hidden": 10})
    with pytest.raises(edge.DecompositionError, match=r"rank \(6, 2\) is too large for layer 'strided'.*\(5, 6\)"):
        edge.plan_decomposition(conv_model, "tucker2", rank={"strided": (6, 2)})
    with pytest.raises(edge.DecompositionError, match=r"rank 46 is too large for layer 'strided'.*at most 45"):
        edge.plan_decomposition(conv_model, "cp", rank={"strided": 46})
    for energy in (0, 1.5, -0.1):
        with pytest.raises(ValueError,
                           match=rf"energy must be a finite number > 0 and <= 1. Received: energy={energy}"):
            edge.plan_decomposition(conv_model, "svd", energy=energy)
    with pytest.raises(edge.DecompositionError, match="layer 'depthwise' is a DepthwiseConv2D, which method 'cp'"):
        edge.plan_decomposition(conv_model, "cp", energy=0.9, layers=["depthwise"])
    with pytest.raises(ValueError, match="method must be one of 'svd', 'tucker2', 'cp'. Received: method='qr'"):
        edge.plan_decomposition(conv_model, "qr", energy=0.9)
    with pytest.raises(edge.DecompositionError, match="rank='vbmf' chooses ranks for the svd and tucker2"):
        edge.plan_decomposition(conv_model, "cp", rank="vbmf")
    with pytest.raises(edge.DecompositionError, match="Pass exactly one of rank= or energy="):
        edge.plan_decomposition(conv_model, "svd", rank=2, energy=0.5)
    class Subclassed(tf_keras.Model):
        def call(self, inputs: Any) -> Any:
            return inputs

    with pytest.raises(edge.DecompositionError, match="needs a functional or Sequential Keras model.*Subclassed"):
        edge.plan_decomposition(Subclassed(), "svd", energy=0.5)
    pooled = tf_keras.Sequential([tf_keras.Input((6, 6, 2)), tf_keras.layers.DepthwiseConv2D(3, name="dw"),
                                  tf_keras.layers.GlobalAveragePooling2D()], name="no_dense")
    with pytest.raises(edge.DecompositionError, match="model 'no_dense' has no layer that method 'svd' factors"):
        edge.decompose(pooled, "svd", energy=0.5)


def test_cli_prints_the_plan_writes_model_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:

    from tensorfleet.cli.main import main

    layers = tf_keras.layers
    inputs = tf_keras.Input((8, 8, 3))
    x = layers.Conv2D(32, 3, padding="same", name="wide")(inputs)
    outputs = layers.Dense(2, name="head")(layers.Flatten()(layers.Conv2D(32, 3, name="wider")(x)))
    path = tmp_path / "model.keras"
    _assign_normal(tf_keras.Model(inputs, outputs, name="cli_model"), 5).save(path)
    out, plot = tmp_path / "small.keras", tmp_path / "plan.png"
    assert main(["edge", "decompose", str(path), "--method", "tucker2", "--rank", "4", "--out", str(out),
                 "--plot", str(plot)]) == 0
    printed = capsys.readouterr().out
    assert "decomposition plan for 'cli_model' (method tucker2)" in printed
    assert re.search(r"\nwider +Conv2D 3x3 +tucker2 +4x4 ", printed)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    small = tf_keras.models.load_model(out, compile=False)
    assert [layer.name for layer in small.layers if "wider" in layer.name] == ["wider_in", "wider_core", "wider_out"]
    for bad, message in [(["--rank", "40"], "rank 40 is too large for layer 'wide'"),
                         (["--energy", "1.5"], "energy must be a finite number > 0 and <= 1"),
                         (["--rank", "x"], "--rank must be an integer, IN,OUT (tucker2) or vbmf")]:
        target = tmp_path / "bad.keras"
        assert main(["edge", "decompose", str(path), "--out", str(target), *bad]) == 2
        assert f"error: {message}" in capsys.readouterr().err
        assert not target.exists()
    assert main(["edge", "decompose", str(path), "--method", "qr", "--energy", "0.9", "--out", str(out)]) == 2
