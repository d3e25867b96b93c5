"""The scripts in examples/ run end to end (short settings) and print what they promise.

train_digits_multiworker.py and train_digits_ps.py run under the launcher in tests/cluster
(fault tolerance, elastic); the others run here, each in a process of its own in a temporary
directory. The one-process scripts start two at a time when the first of them is reached (much of
each is a new process importing TensorFlow, on one core); the scripts that start processes of their
own run alone.
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import user_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# The one-process scripts and their arguments ({dir}: the script's working directory).
ONE_PROCESS = {
    "export_microcontroller.py": ("{dir}/edge", "--epochs", "1"),
    "federated_simulation.py": ("--rounds", "2", "--out", "{dir}/fed"),
    "model_parallel_mesh.py": ("--epochs", "1"),
    "model_parallel_pipeline.py": ("--out", "{dir}/schedule.png"),
}


def _completed(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # As a user runs it: tf.keras is what TensorFlow makes it (Keras 3), not the suite's tf_keras.
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=400, env=user_env(TF_CPP_MIN_LOG_LEVEL="3"))


def _stdout(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def run(script: str, *args: str, cwd: Path) -> str:
    return _stdout(_completed(script, list(args), cwd))


@pytest.fixture(scope="module")
def one_process(request, tmp_path_factory):
    """script -> (its working directory, the Future of its run) for the selected tests' scripts, the
    runs started two at a time."""
    selected = {item.originalname for item in request.session.items}
    root = tmp_path_factory.mktemp("examples")
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs: dict[str, tuple[Path, Future]] = {}
        for script, args in ONE_PROCESS.items():
            if not any(name.startswith(f"test_{Path(script).stem}_") for name in selected):
                continue
            cwd = root / Path(script).stem
            cwd.mkdir()
            runs[script] = (cwd, pool.submit(_completed, script, [a.format(dir=cwd) for a in args], cwd))
        yield {script: (cwd, future) for script, (cwd, future) in runs.items()}


def ran(one_process, script: str) -> tuple[Path, str]:
    cwd, future = one_process[script]
    return cwd, _stdout(future.result())


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_export_microcontroller_writes_a_model_that_fits_the_board_and_its_c_sources(one_process):
    workdir, out = ran(one_process, "export_microcontroller.py")
    assert "target arduino_nano_33_ble (flash 1,048,576, RAM 262,144): fits" in out
    assert sorted(p.name for p in (workdir / "edge" / "c").iterdir()) == [
        "digits_model_data.cc", "digits_model_data.h", "digits_op_resolver.h"]
    assert {"digits_int8.tflite", "digits_int8_report.json", "digits_int8_report.png"} <= {
        p.name for p in (workdir / "edge").iterdir()}


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_federated_simulation_runs_its_rounds_and_leaves_metrics_plots_and_a_checkpoint(one_process):
    import json

    workdir, out = ran(one_process, "federated_simulation.py")
    assert re.search(r"final central test accuracy: 0\.\d{3} after 2 rounds", out), out
    assert {"metrics.json", "metrics.csv", "checkpoint.npz", "accuracy.png", "partition.png", "model.keras"} <= {
        p.name for p in (workdir / "fed").iterdir()}
    # Its shell twin: the YAML beside it with the Keras 3 model file it saved gives the same rounds.
    cli = subprocess.run([sys.executable, "-m", "tensorfleet", "federated", "run", "--config",
                          str(EXAMPLES / "federated_simulation.yaml"), "--model", str(workdir / "fed" / "model.keras"),
                          "--rounds", "2", "--out", str(workdir / "cli"), "--no-progress"],
                         cwd=workdir, capture_output=True, text=True, timeout=400,
                         env=user_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert cli.returncode == 0, cli.stderr[-3000:]
    script_run, cli_run = (json.loads((workdir / d / "metrics.json").read_text()) for d in ("fed", "cli"))
    assert cli_run["config"]["algorithm_options"] == {"mu": 1.0} and cli_run["config"]["aggregator"] == "secagg+"
    for key in ("train_loss", "test_accuracy", "fed_eval_accuracy"):
        assert cli_run["rounds"][-1][key] == pytest.approx(script_run["rounds"][-1][key], abs=1e-6), key


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_model_parallel_mesh_trains_the_same_model_on_all_three_backends(one_process):
    _, out = ran(one_process, "model_parallel_mesh.py")
    losses = dict(re.findall(r"(mtf|keras|dtensor): mesh .* epoch losses \[([0-9.]+)\]", out))
    assert sorted(losses) == ["dtensor", "keras", "mtf"], out
    # Same initial weights and batches: one epoch of 44 SGD steps ends at the same loss.
    assert max(map(float, losses.values())) - min(map(float, losses.values())) < 1e-3, losses


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_model_parallel_pipeline_learns_digits_and_draws_its_schedule(one_process):
    workdir, out = ran(one_process, "model_parallel_pipeline.py")
    match = re.search(r"1f1b: 4 stages of \[2, 2, 2, 2\] layers on 4 devices; .*test accuracy (0\.\d+)", out)
    assert match and float(match.group(1)) > 0.9, out
    assert (workdir / "schedule.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_launch_fault_tolerant_resumes_after_the_killed_worker(tmp_path):
    out = run("launch_fault_tolerant.py", cwd=tmp_path)
    assert re.search(r"exit status 0, 1 restart\(s\)", out), out[-2000:]
    assert "resumed at epoch 3" in out


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_tune_digits_searches_and_its_best_model_scores_what_the_search_said(tmp_path):
    out = run("tune_digits.py", "--max-trials", "2", "--epochs", "1", "--out", str(tmp_path / "tune"), cwd=tmp_path)
    found = re.search(r"best model re-evaluated: val_accuracy=(0\.\d{4}) \(search: (0\.\d{4})\)", out)
    assert found, out
    assert found.group(1) == found.group(2)
    assert {"results.txt", "results.json", "objective.png", "hyperparameters.png", "best_model.keras"} <= {
        p.name for p in (tmp_path / "tune").iterdir()}
