"""Parameter server with plain Keras fit: 2 workers and 1 ps as in-process servers on
127.0.0.1, in a child process (see ps_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ps_results() -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.strategies.ps_job"], cwd=ROOT, capture_output=True, text=True,
        timeout=240, env={**os.environ, "TF_CONFIG": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_digits_cnn_trains_to_90_percent_under_the_parameter_server(ps_results) -> None:
    assert ps_results["test_accuracy"] >= 0.90
    assert ps_results["evaluate"]["accuracy"] >= 0.90
    assert ps_results["history_keys"] == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert ps_results["reload_max_abs_diff"] <= 1e-5


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fit_inputs_give_the_parameter_server_a_dataset_creator_and_steps(ps_results) -> None:
    assert ps_results["input_type"] == "DatasetCreator"
    assert ps_results["steps_per_epoch"] == 23  # ceil(1438 / 64)
    assert ps_results["validation_steps"] == 6  # ceil(359 / 64)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_variables_live_on_the_ps_and_large_ones_are_sharded(ps_results) -> None:
    assert ps_results["variable_devices"] == ["/job:ps/replica:0/task:0"]
    # The 512x64 dense kernel (128 KiB) split into max_shards=2 shards of min 4 KiB.
    assert ps_results["dense_kernel_shards"] == [[256, 64], [256, 64]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_keras3_model_gets_one_error_naming_what_trains_it_on_a_parameter_server(ps_results) -> None:
    if not ps_results["keras3_error"]:
        pytest.skip("Keras 3 is not installed on this track")
    assert ps_results["keras3_error"].startswith(
        "Keras3ModelError: fit_inputs received a Keras 3 model built under a parameter-server strategy, and Keras "
        "3's own fit has no parameter-server training (keras-team/keras#18624). Run it as a migratable job "
        "(`tensorfleet launch --strategy parameter_server --workers N --ps M job.py`")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_batch_level_callbacks_get_a_clear_error(ps_results) -> None:
    assert ps_results["callback_error"].startswith(
        "Batch-level `Callback`s are not supported with `ParameterServerStrategy`.")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_staleness_option_puts_keras_fit_under_stale_synchronous_parallel(ps_results) -> None:
    assert ps_results["staleness"] == "SSP k=2"
    assert 0 <= ps_results["max_clock_gap"] <= 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_workers_read_disjoint_examples_that_together_are_all_of_them(ps_results) -> None:
    # TensorFlow gives every worker InputContext(0 of 1); without the worker's index each read
    # the same ids in the same order.
    first, second = ps_results["ids_read"]["0"], ps_results["ids_read"]["1"]
    assert len(first) == len(second) == 64  # 32 per pass over the 64 examples, two passes
    for part in (slice(0, 32), slice(32, 64)):  # in each pass, every example goes to one worker
        assert not set(first[part]) & set(second[part])
        assert sorted(first[part] + second[part]) == list(range(64))
    assert set(first[:32]) != set(first[32:])  # reshuffled on every pass: other examples each pass


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_lockstep_epoch_feeds_every_example_exactly_once(ps_results) -> None:
    assert ps_results["epoch_steps_per_worker"] == [8, 8]
    assert ps_results["epoch_counts"] == [1] * 64
