"""The scripts in examples/ run end to end (short settings) and print what they promise.

train_digits_multiworker.py and train_digits_ps.py run under the launcher in tests/cluster
(fault tolerance, elastic); the others run here, each in a process of its own in a temporary
directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(script: str, *args: str, cwd: Path) -> str:
    result = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=cwd, capture_output=True,
                            text=True, timeout=400, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_export_microcontroller_writes_a_model_that_fits_the_board_and_its_c_sources(tmp_path):
    out = run("export_microcontroller.py", str(tmp_path / "edge"), "--epochs", "1", cwd=tmp_path)
    assert "target arduino_nano_33_ble (flash 1,048,576, RAM 262,144): fits" in out
    assert sorted(p.name for p in (tmp_path / "edge" / "c").iterdir()) == [
        "digits_model_data.cc", "digits_model_data.h", "digits_op_resolver.h"]
    assert {"digits_int8.tflite", "digits_int8_report.json", "digits_int8_report.png"} <= {
        p.name for p in (tmp_path / "edge").iterdir()}


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_federated_simulation_runs_its_rounds_and_leaves_metrics_plots_and_a_checkpoint(tmp_path):
    out = run("federated_simulation.py", "--rounds", "2", "--out", str(tmp_path / "fed"), cwd=tmp_path)
    assert re.search(r"final central test accuracy: 0\.\d{3} after 2 rounds", out), out
    assert {"metrics.json", "metrics.csv", "checkpoint.npz", "accuracy.png", "partition.png"} <= {
        p.name for p in (tmp_path / "fed").iterdir()}


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_model_parallel_mesh_trains_the_same_model_on_all_three_backends(tmp_path):
    out = run("model_parallel_mesh.py", "--epochs", "1", cwd=tmp_path)
    losses = dict(re.findall(r"(mtf|keras|dtensor): mesh .* epoch losses \[([0-9.]+)\]", out))
    assert sorted(losses) == ["dtensor", "keras", "mtf"], out
    # Same initial weights and batches: one epoch of 44 SGD steps ends at the same loss.
    assert max(map(float, losses.values())) - min(map(float, losses.values())) < 1e-3, losses


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_model_parallel_pipeline_learns_digits_and_draws_its_schedule(tmp_path):
    out = run("model_parallel_pipeline.py", "--out", str(tmp_path / "schedule.png"), cwd=tmp_path)
    match = re.search(r"1f1b: 4 stages of \[2, 2, 2, 2\] layers on 4 devices; .*test accuracy (0\.\d+)", out)
    assert match and float(match.group(1)) > 0.9, out
    assert (tmp_path / "schedule.png").stat().st_size > 0


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
