"""``tensorfleet launch --profile-steps``: every task of a launched job records the chosen steps."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import keras2_env

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    model.fit(np.ones((12, 4), "float32"), np.ones((12, 2), "float32"), batch_size=2, epochs=1, verbose=0)
""")


def _launch(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in keras2_env().items() if k != "TF_CONFIG"}
    return subprocess.run([sys.executable, "-m", "tensorfleet.cli.main", "launch", "--workers", "2", *options,
                           str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_launch_profile_steps_records_each_task_of_the_job(tmp_path):
    from tensorfleet.profiling.xspace import find_traces, task_traces

    done = _launch(tmp_path, "--profile-steps", "2-3", "--profile-dir", "prof")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == f"profile: tensorfleet profile report {tmp_path / 'prof'}"
    assert {task: len(files) for task, files in find_traces(tmp_path / "prof").items()} == {
        "worker-0": 1, "worker-1": 1}
    assert sorted((t.task, [s.number for s in t.steps]) for t in task_traces(tmp_path / "prof")) == [
        ("worker-0", [2, 3]), ("worker-1", [2, 3])]


@pytest.mark.slow
def test_launch_refuses_a_bad_step_range_before_starting_anything(tmp_path):
    done = _launch(tmp_path, "--profile-steps", "30-20")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --profile-steps must be a step range FIRST-LAST with FIRST <= LAST, such as '20-30'. "
        "Received: --profile-steps='30-20'")
    assert not (tmp_path / "profile").exists()
