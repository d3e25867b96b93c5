"""Mesh-TF layouts: the import fix, parsing and its errors, and 2x2 meshes matching one device."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet import models
from tensorfleet.compat.keras import keras2
from tensorfleet.compat.mesh_tf import apply_import_fixes, import_mesh_tensorflow, layout_pairs
from tensorfleet.model_parallel import mesh as tfmesh
from tensorfleet.model_parallel.mesh.training import count_devices as count_devices_of
from tensorfleet.models.datasets import load_digits
from tests.conftest import keras2_env

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

STEPS, BATCH, LR = 5, 32, 0.5


@pytest.mark.slow
def test_mesh_tensorflow_fails_without_the_fix_and_imports_with_it():
    script = (
        "import tensorflow\n"
        "try:\n"
        "    import mesh_tensorflow\n"
        "except (AttributeError, ImportError) as exc:\n"
        "    print('without fix:', type(exc).__name__, exc)\n"
        "from tensorfleet.compat.mesh_tf import import_mesh_tensorflow, needs_conversion_alias, "
        "tensorflow_has_estimator\nprint('needs fix:', needs_conversion_alias() or not tensorflow_has_estimator())\n"
        "mtf = import_mesh_tensorflow()\n"
        "print('with fix:', mtf.convert_to_shape('b1:2;b2:2'))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                            env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    # TensorFlow >= 2.16 stops at the Estimator import first; 2.13-2.15 at the moved conversion function.
    assert lines[0] in ("without fix: ImportError cannot import name 'estimator' from 'tensorflow.compat.v1' "
                        f"({tf.compat.v1.__file__})",
                        "without fix: AttributeError module 'tensorflow.python.framework.ops' has no attribute "
                        "'register_tensor_conversion_function'"), lines[0]
    assert lines[1:] == ["needs fix: True", "with fix: Shape[b1=2, b2=2]"]


def test_compat_fix_is_idempotent():
    mtf = import_mesh_tensorflow()
    from tensorflow.python.framework import ops, tensor_conversion_registry

    assert apply_import_fixes() is False
    assert ops.register_tensor_conversion_function is tensor_conversion_registry.register_tensor_conversion_function
    assert mtf.__name__ == "mesh_tensorflow"


def test_layout_pairs_reads_the_rules_mesh_tensorflow_parsed():
    rules = import_mesh_tensorflow().convert_to_layout_rules("hidden:b2;batch:b1")
    assert layout_pairs(rules) == [("batch", "b1"), ("hidden", "b2")]
    assert layout_pairs(import_mesh_tensorflow().convert_to_layout_rules("")) == []


def test_layout_is_parsed_by_mesh_tensorflow():
    layout = tfmesh.MeshLayout("b1:2;b2:2", "batch:b1;hidden:b2")
    mtf = import_mesh_tensorflow()
    assert isinstance(layout.mtf_shape, mtf.Shape) and isinstance(layout.mtf_rules, mtf.LayoutRules)
    assert layout.mesh_dims == {"b1": 2, "b2": 2}
    assert layout.rules == {"batch": "b1", "hidden": "b2"}
    assert layout.size == 4
    assert [layout.coordinates(p) for p in range(4)] == [
        {"b1": 0, "b2": 0}, {"b1": 0, "b2": 1}, {"b1": 1, "b2": 0}, {"b1": 1, "b2": 1}]
    assert tfmesh.MeshLayout("all:4").rules == {}


def test_model_dimensions_name_the_tensor_dimensions():
    assert tfmesh.model_dimensions(models.build("digits_mlp", keras="tf_keras"), 32) == {
        "batch": 32, "features": 64, "hidden": 64, "classes": 10}
    dims = tfmesh.model_dimensions(models.build("transformer_block", keras="tf_keras"), 16)
    assert dims == {"batch": 16, "seq": 8, "memory_seq": 8, "features": 8, "d_model": 16, "heads": 4, "kv": 4,
                    "hidden": 32, "classes": 10}


def test_unknown_mesh_dimension_is_a_clear_error():
    with pytest.raises(ValueError, match=r"Layout rule 'hidden:b3' names mesh dimension 'b3', which the mesh has not; "
                                         r"mesh dimensions: b1, b2"):
        tfmesh.MeshLayout("b1:2;b2:2", "batch:b1;hidden:b3")


def test_unknown_tensor_dimension_is_a_clear_error():
    mesh = tfmesh.Mesh("b1:2;b2:2", "batch:b1;ffn:b2")
    with pytest.raises(ValueError, match=r"Layout rule 'ffn:b2' names tensor dimension 'ffn', which the model has not; "
                                         r"its dimensions are: batch, classes, features, hidden"):
        mesh.check(models.build("digits_mlp", keras="tf_keras"), 32)


def test_mesh_that_does_not_divide_a_dimension_is_a_clear_error():
    mesh = tfmesh.Mesh("b1:1;b2:4", "batch:b1;hidden:b2")
    with pytest.raises(ValueError, match=r"Mesh dimension 'b2' of size 4 does not divide tensor dimension 'hidden' of "
                                         r"size 6"):
        mesh.check(models.build("digits_mlp", hidden=6, keras="tf_keras"), 32)
    with pytest.raises(ValueError, match=r"does not divide tensor dimension 'batch' of size 30"):
        tfmesh.Mesh("b1:4", "batch:b1").check(models.build("digits_mlp", keras="tf_keras"), 30)


def test_mesh_larger_than_devices_is_a_clear_error(logical_cpus):
    mesh = tfmesh.Mesh("b1:2;b2:4", "batch:b1;hidden:b2")
    with pytest.raises(ValueError, match=r"The mesh 'b1:2;b2:4' needs 8 devices but only 4 are available"):
        mesh.check(models.build("digits_mlp", keras="tf_keras"), 32)


@pytest.mark.parametrize("mesh_shape,layout,pattern", [
    ("b1=2", "", r"mesh_shape must look like \"b1:2;b2:2\".*Received: mesh_shape='b1=2'"),
    ("", "", r"mesh_shape must be a non-empty string.*Received: mesh_shape=''"),
    ("b1:2", "batch", r"layout must look like \"batch:b1;hidden:b2\".*Received: layout='batch'"),
    ("b1:2;b2:2", "batch:b1;batch:b2", r"Tensor dimension 'batch' is laid out on more than one mesh dimension"),
])
def test_malformed_layout_strings_are_clear_errors(mesh_shape, layout, pattern):
    with pytest.raises(ValueError, match=pattern):
        tfmesh.MeshLayout(mesh_shape, layout)


def test_unknown_backend_lists_the_backends():
    with pytest.raises(ValueError,
                       match=r"Unknown mesh backend 'kras'. Did you mean 'keras'\? Available: dtensor, mtf, keras"):
        tfmesh.Mesh("b1:2", "batch:b1", backend="kras")


def _single_device_run(name: str, x: np.ndarray, y: np.ndarray):
    model = models.build(name, keras="tf_keras")
    optimizer = tf_keras.optimizers.SGD(LR)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    losses = []
    with tf.device("/CPU:0"):
        for s in range(STEPS):
            xb, yb = x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH]
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            losses.append(float(loss))
        final = float(loss_fn(y[:BATCH], model(x[:BATCH])))
    return losses, final, model


CASES = {
    "mlp": ("digits_mlp", "batch:b1;hidden:b2"),
    "transformer": ("transformer_block", "batch:b1;hidden:b2;heads:b2"),
}


def _data(name: str):
    if name == "digits_mlp":
        split = load_digits(flat=True)
        return split.x_train[: STEPS * BATCH], split.y_train[: STEPS * BATCH]
    split = load_digits()
    return split.x_train[: STEPS * BATCH, ..., 0], split.y_train[: STEPS * BATCH]


@pytest.mark.parametrize("backend", ["mtf", "keras"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_2x2_mesh_matches_single_device_after_5_steps(case, backend, logical_cpus):
    name, layout = CASES[case]
    x, y = _data(name)
    ref_losses, ref_final, ref_model = _single_device_run(name, x, y)
    model = models.build(name, keras="tf_keras")  # same seed: the same initial weights as the reference
    mesh = tfmesh.Mesh("b1:2;b2:2", layout, backend=backend)
    history = mesh.fit(model, x, y, epochs=1, batch_size=BATCH, learning_rate=LR, verbose=False)
    assert len(history.step_loss) == STEPS
    np.testing.assert_allclose(history.step_loss, ref_losses, atol=1e-5, rtol=0)
    final = float(tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y[:BATCH], model(x[:BATCH])))
    assert abs(final - ref_final) < 1e-5
    for got, want in zip(model.get_weights(), ref_model.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert ref_losses[-1] != ref_losses[0]  # the weights did move
    assert history.devices == logical_cpus
    if backend == "mtf":  # the lowered graph has slices and computation on every device
        assert set(history.placement) == {f"/device:CPU:{i}" for i in range(4)}, history.placement
    else:  # one sharded copy of the weights on the model axis (row 0); replica r computes on row r
        assert set(history.placement) == {f"/device:CPU:{i}" for i in range(4)}, history.placement
        assert history.grid == [logical_cpus[:2], logical_cpus[2:]]


_DTENSOR_SCRIPT = r"""
import json, sys
sys.path.insert(0, {tests!r})
from tensorfleet.strategies.devices import simulate_devices
simulate_devices(4)
import numpy as np
import tensorflow as tf
from tensorfleet import models
from tensorfleet.model_parallel import mesh as tfmesh
import test_mesh as t

out = {{}}
for key, (case, mesh_shape, layout) in {{
        "mlp": ("mlp", "b1:2;b2:2", "batch:b1;hidden:b2"),
        "transformer": ("transformer", "b1:2;b2:2", "batch:b1;hidden:b2;heads:b2"),
        "mlp_m4": ("mlp", "m:4", "hidden:m")}}.items():
    name = t.CASES[case][0]
    x, y = t._data(name)
    ref_losses, ref_final, ref_model = t._single_device_run(name, x, y)
    model = models.build(name, keras="tf_keras")
    history = tfmesh.Mesh(mesh_shape, layout, backend="dtensor").fit(
        model, x, y, epochs=1, batch_size=t.BATCH, learning_rate=t.LR, verbose=False)
    out[key] = {{
        "loss_diff": float(np.max(np.abs(np.array(history.step_loss) - ref_losses))),
        "weight_diff": float(max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(), ref_model.get_weights()))),
        "steps": len(history.step_loss), "moved": ref_losses[-1] != ref_losses[0],
        "placement": history.placement, "params": model.count_params()}}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_dtensor_backend_matches_single_device_in_its_own_process():
    # DTensor's collectives take group key 1, which a tf.distribute strategy built directly by
    # TensorFlow also takes, and tests in this process build such strategies (the next test
    # shows the clash): this backend is tested in a process of its own.
    import os

    tests = os.path.dirname(__file__)
    result = subprocess.run([sys.executable, "-c", _DTENSOR_SCRIPT.format(tests=tests)], capture_output=True,
                            text=True, timeout=540, env=keras2_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    out = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for key, row in out.items():
        assert row["steps"] == STEPS and row["moved"], key
        assert row["loss_diff"] < 1e-5 and row["weight_diff"] < 1e-5, (key, row)
    # every device holds its shard: the hidden/heads weights halved on the 2x2 mesh
    held_mlp = 64 * 32 + 32 + 32 * 10 + 10
    held_transformer = (8 * 16 + 16 + 3 * (16 * 2 * 4 + 2 * 4) + 2 * 4 * 16 + 16 + 16 * 16 + 16 + 16 * 16 + 16
                        + 16 * 10 + 10)
    assert out["mlp"]["placement"] == {f"/device:CPU:{i}": held_mlp for i in range(4)}
    assert out["transformer"]["placement"] == {f"/device:CPU:{i}": held_transformer for i in range(4)}
    assert held_mlp < out["mlp"]["params"] and held_transformer < out["transformer"]["params"]
    assert out["mlp_m4"]["placement"] == {f"/device:CPU:{i}": 64 * 16 + 16 + 16 * 10 + 10 for i in range(4)}


_SHARE_SCRIPT = r"""
import sys
from tensorfleet.strategies.devices import simulate_devices
simulate_devices(4)
import numpy as np
import tensorflow as tf
import tensorfleet as tfl
from tensorfleet.model_parallel import mesh as tfmesh

x = np.random.RandomState(0).rand(64, 64).astype("float32")
y = (np.arange(64) % 10).astype("int32")

def mirrored(n):
    devices = [f"/cpu:{{i}}" for i in range(n)]
    if {raw}:
        strategy = tf.distribute.MirroredStrategy(devices)
    else:
        strategy = tfl.strategies.build("mirrored", devices=devices)
    with strategy.scope():
        model = tfl.models.build("digits_mlp")
        model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    loss = model.fit(x, y, epochs=1, batch_size=16, verbose=0).history["loss"][-1]
    print(f"mirrored {{n}} loss {{loss:.4f}}", flush=True)

mirrored(2)
history = tfmesh.Mesh("b1:2;b2:2", "batch:b1;hidden:b2", backend="dtensor").fit(
    tfl.models.build("digits_mlp"), x, y, epochs=1, batch_size=16, verbose=False)
print(f"dtensor steps {{len(history.step_loss)}}", flush=True)
mirrored(4)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("raw", [False, True], ids=["tensorfleet_mirrored", "raw_tf_mirrored"])
@pytest.mark.slow
def test_dtensor_backend_shares_a_process_with_tensorfleet_mirrored_strategies(raw):
    # In TF 2.14 DTensor's collectives use group key 1, the first key of a MirroredStrategy
    # built by TensorFlow; strategies built by tensorfleet take their own key range.

    result = subprocess.run([sys.executable, "-c", _SHARE_SCRIPT.format(raw=raw)], capture_output=True, text=True,
                            timeout=240, env=keras2_env(TF_CPP_MIN_LOG_LEVEL="3"))
    lines = [line.split()[:2] for line in result.stdout.splitlines() if line.startswith(("mirrored", "dtensor"))]
    if raw:  # the TensorFlow bug that tensorfleet's key ranges avoid
        assert result.returncode != 0 and lines == [["mirrored", "2"]], result.stdout
        # Whichever device's collective fails first reports: the group clash, or the cancellation it causes.
        assert ("is joining a group that is already full (group_key=1)" in result.stderr
                or "Function was cancelled before it was started" in result.stderr), result.stderr[-3000:]
    else:
        assert result.returncode == 0, result.stderr[-3000:]
        assert lines == [["mirrored", "2"], ["dtensor", "steps"], ["mirrored", "4"]], result.stdout


def test_keras_backend_rejects_layouts_it_cannot_run(logical_cpus):
    x, y = _data("digits_mlp")
    mesh = tfmesh.Mesh("b1:2;b2:2", "batch:b1;classes:b2", backend="keras")
    with pytest.raises(ValueError, match=r"keras mesh backend splits only the batch, hidden and heads dimensions"):
        mesh.fit(models.build("digits_mlp", keras="tf_keras"), x, y, batch_size=BATCH, verbose=False)


def test_fit_rejects_bad_arguments(logical_cpus):
    x, y = _data("digits_mlp")
    mesh = tfmesh.Mesh("b1:2;b2:2", "batch:b1;hidden:b2")
    with pytest.raises(ValueError, match=r"batch_size must be a positive integer. Received: batch_size=0"):
        mesh.fit(models.build("digits_mlp", keras="tf_keras"), x, y, batch_size=0)
    with pytest.raises(ValueError, match=r"learning_rate must be a finite number > 0. Received: learning_rate=-1"):
        mesh.fit(models.build("digits_mlp", keras="tf_keras"), x, y, learning_rate=-1)
    with pytest.raises(ValueError, match=r"Mesh layouts support inputs of shape \(batch, features\) or \(batch, seq, "
                                         r"features\). Received: input shape \(None, 8, 8, 1\)"):
        mesh.fit(models.build("digits_cnn", keras="tf_keras"), x.reshape(-1, 8, 8, 1), y)


@pytest.mark.parametrize("backend", ["mtf", "keras"])
def test_pure_tensor_parallel_mesh_of_4_matches_single_device(backend, logical_cpus):
    x, y = _data("digits_mlp")
    ref_losses, _, ref_model = _single_device_run("digits_mlp", x, y)
    model = models.build("digits_mlp", keras="tf_keras")
    history = tfmesh.Mesh("m:4", "hidden:m", backend=backend).fit(model, x, y, batch_size=BATCH, learning_rate=LR,
                                                                  verbose=False)
    np.testing.assert_allclose(history.step_loss, ref_losses, atol=1e-5, rtol=0)
    for got, want in zip(model.get_weights(), ref_model.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert set(history.placement) == {f"/device:CPU:{i}" for i in range(4)}
    if backend == "keras":
        assert history.grid == [logical_cpus]


def _mtf_mlp(mtf, mesh, inputs, dims):
    h = mtf.layers.dense(inputs, dims["hidden"], activation=mtf.relu, name="hidden_layer")
    return mtf.layers.dense(h, dims["classes"], name="logits")


def test_model_written_with_mtf_layers_trains_the_same_on_2x2_mesh_as_on_one_device(logical_cpus):
    x, y = _data("digits_mlp")
    one = tfmesh.Mesh("all:1").fit_mtf(_mtf_mlp, x, y, dims={"hidden": 32, "classes": 10}, epochs=2,
                                       batch_size=BATCH, learning_rate=LR, verbose=False)
    mesh = tfmesh.Mesh("b1:2;b2:2", "batch:b1;hidden:b2")
    history = mesh.fit_mtf(_mtf_mlp, x, y, dims={"hidden": 32, "classes": 10}, epochs=2, batch_size=BATCH,
                           learning_rate=LR, verbose=False)
    assert len(history.step_loss) == 2 * STEPS and len(history.loss) == 2
    np.testing.assert_allclose(history.step_loss, one.step_loss, atol=1e-5, rtol=0)
    assert history.loss[1] < history.loss[0]
    assert sorted(history.weights) == sorted(one.weights)
    kernel = next(name for name in history.weights if name.startswith("hidden_layer") and "kernel" in name)
    assert history.weights[kernel].shape == (64, 32)
    np.testing.assert_allclose(history.weights[kernel], one.weights[kernel], atol=1e-5)
    assert set(history.placement) == {f"/device:CPU:{i}" for i in range(4)}
    assert set(one.placement) == {"/device:CPU:0"}


def test_fit_mtf_checks_dims_against_the_layout(logical_cpus):
    x, y = _data("digits_mlp")
    mesh = tfmesh.Mesh("b1:2;b2:2", "batch:b1;hidden:b2")
    with pytest.raises(ValueError, match=r"does not divide tensor dimension 'hidden' of size 33"):
        mesh.fit_mtf(_mtf_mlp, x, y, dims={"hidden": 33, "classes": 10}, batch_size=BATCH)
    with pytest.raises(ValueError, match=r"dims must map dimension names to sizes and include 'classes'"):
        mesh.fit_mtf(_mtf_mlp, x, y, dims={"hidden": 32}, batch_size=BATCH)
    with pytest.raises(ValueError, match=r"dims\['hidden'\] must be a positive integer. Received: dims\['hidden'\]=0"):
        mesh.fit_mtf(_mtf_mlp, x, y, dims={"hidden": 0, "classes": 10}, batch_size=BATCH)


def test_history_records_each_step_wall_time(logical_cpus):
    x, y = _data("digits_mlp")
    history = tfmesh.Mesh("b1:2;b2:2", "batch:b1;hidden:b2", backend="keras").fit(
        models.build("digits_mlp", keras="tf_keras"), x, y, epochs=2, batch_size=BATCH, verbose=False)
    assert len(history.step_seconds) == 2 * STEPS
    assert all(t > 0 for t in history.step_seconds)


def _executed_matmuls(run):
    """Runs ``run()`` with TensorFlow's run metadata on; returns, for the training step's function,
    the device every matmul/einsum executed on, and the device each op was traced for."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        run()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    step = next(f for f in metadata.function_graphs
                if any(n.name.startswith("gradient") for n in f.pre_optimization_graph.node))
    def short(device):
        return next(iter(count_devices_of([device]))) if device else ""

    executed = {n.name: short(n.device) for p in step.partition_graphs for n in p.node
                if "MatMul" in n.op or "Einsum" in n.op}
    traced = {n.name: short(n.device) for n in step.pre_optimization_graph.node}
    return executed, traced


@pytest.mark.parametrize("case", sorted(CASES))
def test_keras_backend_runs_each_gradient_matmul_on_its_shards_device(case, logical_cpus):
    # Read from the partitioned graphs TensorFlow executed, not from where the variables live.
    name, layout = CASES[case]
    x, y = _data(name)
    mesh = tfmesh.Mesh("b1:2;b2:2", layout, backend="keras")
    executed, traced = _executed_matmuls(
        lambda: mesh.fit(models.build(name, keras="tf_keras"), x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=False))
    backward = {op: device for op, device in executed.items() if op.startswith("gradient")}
    forward = {op: device for op, device in executed.items() if not op.startswith("gradient")}
    assert forward and all(device == traced[op] for op, device in forward.items()), forward
    per_device = count_devices_of(backward.values())
    if case == "mlp":  # per replica and shard: d(row kernel), d(hidden), d(column kernel)
        assert per_device == {f"/device:CPU:{i}": 3 for i in range(4)}, backward
    else:  # 16 per shard of the block; the unsplit embedding and classifier (3) on each replica's first device
        assert per_device == {"/device:CPU:0": 19, "/device:CPU:1": 16, "/device:CPU:2": 19, "/device:CPU:3": 16}
    for op, device in backward.items():  # gradients/<forward op>_grad/...: with the op it differentiates
        differentiated = op[len("gradients/"):].split("_grad/")[0]
        assert device == traced[differentiated], (op, device, traced[differentiated])



@pytest.mark.parametrize("backend", ["mtf", "keras"])
def test_a_model_compiled_in_the_scope_trains_with_its_own_fit(backend, logical_cpus):
    x, y = _data("digits_mlp")
    ref_losses, ref_final, ref_model = _single_device_run("digits_mlp", x, y)
    mesh = tfmesh.Mesh("b1:2;b2:2", "batch:b1;hidden:b2", backend=backend)
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with mesh.scope():
        model = models.build("digits_mlp", keras="tf_keras")  # the same seed: the same initial weights as the reference
        model.compile(tf_keras.optimizers.SGD(LR), loss, metrics=["accuracy"])
    history = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert list(history.history) == ["loss"] and len(model.mesh_trainer.step_loss) == STEPS
    np.testing.assert_allclose(model.mesh_trainer.step_loss, ref_losses, atol=1e-5, rtol=0)
    assert abs(history.history["loss"][0] - np.mean(ref_losses)) < 1e-5
    for got, want in zip(model.get_weights(), ref_model.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)
    evaluated = model.evaluate(x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=0, return_dict=True)
    assert abs(evaluated["loss"] - ref_final) < 1e-5 and sorted(evaluated) == ["accuracy", "loss"]
    np.testing.assert_allclose(model.predict(x[:BATCH], verbose=0), ref_model(x[:BATCH]).numpy(), atol=1e-5)
    # what the backend cannot run is refused at compile, before any step
    with mesh.scope():
        with pytest.raises(ValueError,
                           match=rf"^The {backend} mesh backend trains with plain SGD \(tf.keras.optimizers.SGD "
                                             r"without momentum\); backend='dtensor' takes any Keras optimizer. "
                                             r"Received: optimizer=<.*Adam"):
            models.build("digits_mlp", keras="tf_keras").compile(tf_keras.optimizers.Adam(), loss)
        with pytest.raises(ValueError,
                           match=r"^Mesh layouts support inputs of shape \(batch, features\) or \(batch, seq, "
                                             r"features\). Received: input shape \(None, 8, 8, 1\)$"):
            models.build("digits_cnn", keras="tf_keras").compile(tf_keras.optimizers.SGD(LR), loss)
