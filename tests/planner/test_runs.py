"""The plan that runs: a plan row as a mesh, a script run under it, and the bytes each device holds beside the
plan's prediction (exact where the prediction and the run should agree to the byte)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tensorfleet.cli.main import main
from tensorfleet.planner import plans, runs
from tests.conftest import user_env

# digits_mlp: Dense(64) on 64 inputs, Dense(10): 4,810 parameters; float32 Adam keeps 4 + 8 bytes of each.
PLAN = dict(batch_size=64, devices=4, device_memory="16GB", bandwidth="10Gbps", device_tflops=0.01)
CLI = ["plan", "--model", "digits_mlp", "--batch", "64", "--devices", "4", "--device-memory", "16GB", "--bandwidth",
       "10Gbps", "--device-tflops", "0.01", "--precision", "float32"]

_SCRIPT = r"""
import sys
import numpy as np
import tensorfleet as tfl
keras = __import__(sys.argv[1])  # keras (Keras 3) or tf_keras
mesh = tfl.planner.planned_mesh()
with mesh.scope():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.RandomState(0)
x, y = rng.rand(192, 64).astype("float32"), (np.arange(192) % 10).astype("int32")
model.fit(x, y, batch_size=mesh.batch_size, epochs=1, verbose=0)
print("ran", mesh.layout.mesh_shape, model.count_params())
"""


def _float32(**training):
    return plans.plan("digits_mlp", **PLAN, training=plans.TrainingOptions(precision="float32", **training))


def test_each_runnable_row_is_a_mesh_and_the_others_say_why_not():
    result = plans.plan("digits_cnn", **PLAN)  # 7 layers: a 4-stage pipeline row exists
    assert runs.mesh_spec(result.row("data_allreduce")) == ("b:4", "batch:b")
    assert runs.mesh_spec(result.row("tensor")) == ("b:1;m:4", "batch:b;hidden:m;heads:m")
    assert runs.mesh_spec({"strategy": "hybrid", "layout": {"data": 2, "tensor": 2, "pipeline": 1}}) == (
        "b:2;m:2", "batch:b;hidden:m;heads:m")
    with pytest.raises(runs.NotAMeshError, match=r"^The plan's pipeline layout \(d=1 t=1 p=4\) cannot run on a mesh "
                                                 r"yet: a pipeline's stages run one after another.*Received: "
                                                 r"strategy='pipeline'$"):
        result.mesh("pipeline")
    with pytest.raises(runs.NotAMeshError, match=r"^The plan's data_ps layout .*'parameter_server' strategy"):
        result.mesh("ps")
    mesh = _float32(zero=2).mesh("data_allreduce")  # nothing touches the devices before the scope
    assert (mesh.layout.mesh_shape, mesh.layout.layout, mesh.zero, mesh.batch_size) == ("b:4", "batch:b", 2, 64)
    with pytest.raises(ValueError, match=r"^The plan has no pipeline row: 4 stages but only 3 layers\. Received: "
                                         r"strategy='pipeline'$"):
        _float32().mesh("pipeline")


def test_planned_mesh_outside_a_run_is_the_fallback_or_one_error(monkeypatch):
    monkeypatch.delenv(runs.ENV, raising=False)
    from tensorfleet.model_parallel.mesh import Mesh

    fallback = Mesh("b:2", "batch:b")
    assert runs.planned_mesh(fallback) is fallback
    with pytest.raises(RuntimeError, match=r"^No plan is running this script: run it with `tensorfleet plan \.\.\. "
                                           r"--run script\.py`.*Received: TENSORFLEET_PLAN_RUN not set$"):
        runs.planned_mesh()


def test_run_options_without_run_are_refused(capsys):
    assert main([*CLI, "--run-strategy", "tensor", "--run-timeout", "5", "--run-processes", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --run-strategy, --run-timeout, --run-processes apply to --run only. Received: --run-strategy=tensor, "
        "--run-timeout=5.0, --run-processes=2 and no --run")
    assert main([*CLI, "stray"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: Arguments after the options reach a --run script only. Received: 'stray' and no --run")


def test_a_process_count_that_does_not_split_the_devices_is_refused(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    with pytest.raises(ValueError, match=r"^The plan's 4 devices do not split evenly over 3 processes; give a process "
                                         r"count that divides 4\. Received: processes=3$"):
        _float32().run(script, processes=3, report=tmp_path / "r.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # nothing started, nothing written


@pytest.mark.slow
def test_a_run_over_two_processes_holds_the_planned_bytes_on_every_device(tmp_path, keras3):
    # The recommendation is hybrid d=2 t=2: every weight of this model splits over m (64 and 10 units are even),
    # so the plan's Megatron picture and the mesh agree to the byte: 4,810 x 4 / 2 parameters per device. The
    # mesh spans 2 launched processes of 2 logical CPUs; each measures the devices it holds.
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "tensorfleet.cli.main", *CLI, "--report", str(report), "--run-processes", "2",
               "--run", str(script), "--", "keras"]
    done = subprocess.run(command, env=user_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[worker:0] ran b:2;m:2 4810" in done.stdout and "[worker:1] ran b:2;m:2 4810" in done.stdout
    data = json.loads(report.read_text())
    assert (data["strategy"], data["mesh_shape"], data["rules"]) == ("hybrid", "b:2;m:2", "batch:b;hidden:m;heads:m")
    assert [d.rsplit("/", 2)[-2:] for d in data["devices"]] == [
        ["task:0", "device:CPU:0"], ["task:0", "device:CPU:1"], ["task:1", "device:CPU:0"], ["task:1", "device:CPU:1"]]
    assert data["measured"] == {"parameters": [9620] * 4, "optimizer_state": [19240] * 4,
                                "optimizer_counters": [12] * 4}  # Adam's int64 iteration + float32 learning rate
    assert (data["planned"]["parameters"], data["planned"]["optimizer_state"]) == (9620.0, 19240.0)
    assert (data["by_layout"]["parameters"], data["by_layout"]["optimizer_state"]) == (9620.0, 19240.0)
    # Step times: both there (the measured one is a median of steps after the first; no timing is asserted).
    assert data["planned"]["step_seconds"] > 0 and data["step_seconds"] > 0 and data["steps"] == 2  # 3 steps
    assert data["batch_sizes"] == [64]
    assert report.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = done.stdout[done.stdout.index("plan: hybrid"):]
    assert "parameters" in table and "step" in table and "measured/plan" in table


_API = r"""
import json
from tensorfleet.strategies.devices import simulate_devices
simulate_devices(4)
import numpy as np
import keras, tf_keras
from tensorfleet.planner import plans
PLAN = dict(batch_size=64, devices=4, device_memory="16GB", bandwidth="10Gbps", device_tflops=0.01)
out = {}
for key, package, zero, strategy in (("keras3_tensor", keras, 0, "tensor"),
                                     ("tf_keras_zero1", tf_keras, 1, "data_allreduce")):
    result = plans.plan("digits_mlp", **PLAN, training=plans.TrainingOptions(precision="float32", zero=zero))
    mesh = result.mesh(strategy)
    with mesh.scope():
        model = package.Sequential([package.Input((64,)), package.layers.Dense(64, activation="relu"),
                                    package.layers.Dense(10)])
        model.compile(optimizer=package.optimizers.Adam(1e-3),
                      loss=package.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = np.random.RandomState(0).rand(128, 64).astype("float32"), (np.arange(128) % 10).astype("int32")
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    report = mesh.report()
    out[key] = {**report.as_dict(), "table": report.table()}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_the_python_route_measures_layouts_that_differ_from_the_plan():
    done = subprocess.run([sys.executable, "-c", _API], env=user_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.split("RESULT", 1)[1])
    # Keras 3, tensor t=4: the 10-unit layer does not split over 4 and stays whole; the plan assumes every weight
    # split (4,810 x 4 / 4 bytes), the layout column and the run hold the same.
    tensor = out["keras3_tensor"]
    held = 64 * 16 + 16 + 64 * 10 + 10  # elements on each device
    assert tensor["measured"]["parameters"] == [4 * held] * 4
    assert tensor["measured"]["optimizer_state"] == [8 * held] * 4
    assert (tensor["by_layout"]["parameters"], tensor["planned"]["parameters"]) == (4 * held, 4810.0)
    assert tensor["steps"] == 1 and tensor["step_seconds"] > 0  # 2 steps, the first (tracing) left out
    assert "measured/plan" in tensor["table"]
    # tf_keras, ZeRO 1 over 4 replicas: each slot split on its first axis 4 divides; the 10-unit bias has none.
    zero = out["tf_keras_zero1"]
    slots = 2 * (64 * 64 // 4 + 64 // 4 + 64 * 10 // 4 + 10)
    assert (zero["mesh_shape"], zero["zero"]) == ("b:4", 1)
    assert zero["measured"]["parameters"] == [4 * 4810] * 4
    assert zero["measured"]["optimizer_state"] == [4 * slots] * 4
    assert (zero["by_layout"]["optimizer_state"], zero["planned"]["optimizer_state"]) == (4 * slots, 8 * 4810 / 4)


@pytest.mark.slow
def test_a_script_that_never_asks_for_the_mesh_fails_with_its_status(tmp_path, capsys):
    script = tmp_path / "other.py"
    script.write_text("print('no mesh here')\n")
    report = tmp_path / "r.json"
    assert main([*CLI, "--report", str(report), "--run", str(script)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"error: The script under the plan's mesh failed (exit status 1; its output is above). Received: "
                   f"script={str(script)!r}, args=[]")
    assert not report.exists() and not report.with_suffix(".png").exists()
