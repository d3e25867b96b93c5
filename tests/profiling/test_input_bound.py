"""A sleep injected in the input pipeline, recorded with the Keras callback and read back from the trace."""

from __future__ import annotations

import json
import statistics

import pytest

from tensorfleet.compat.keras import keras2
from tests.profiling.conftest import SLEEP_MS

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


def test_only_the_chosen_steps_are_recorded_into_the_task_directory(recorded):
    from tensorfleet.profiling.xspace import task_traces

    logdir, callback = recorded
    assert callback.directory == logdir / "local"
    (trace,) = task_traces(logdir)
    assert trace.task == "local"
    assert [s.number for s in trace.steps] == list(range(3, 13))


def test_the_injected_sleep_is_recovered_as_input_time_and_judged_input_bound(recorded):
    from tensorfleet import profiling

    profile = profiling.analyze(recorded[0])
    (task,) = profile.tasks
    assert task.steps == 9  # the first recorded step carries the profiler's start-up and is left out
    # The typical step waits the sleep. On a loaded machine a step may stall with no op running (idle),
    # the pipeline meanwhile gets ahead and the next step waits less: the mean moves, the median does not.
    assert statistics.median(row.input_ms for row in profile.steps) == pytest.approx(SLEEP_MS, rel=0.15)
    assert task.exposed_communication_ms == 0.0 and task.communication_ms == 0.0
    assert profile.verdict.bottleneck is profiling.Bottleneck.INPUT
    assert profile.verdict.advice.startswith(f"prefetch: each step waits {task.input_ms:.1f} ms for its batch")
    for row in profile.steps:  # the parts of every step add up to the step
        assert row.compute_ms + row.exposed_communication_ms + row.input_ms + row.idle_ms == pytest.approx(row.step_ms)


def test_report_writes_json_png_and_a_trace_that_perfetto_reads(recorded, tmp_path):
    from tensorfleet import profiling

    profile = profiling.analyze(recorded[0])
    paths = profiling.write_report(profile, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["verdict"]["bottleneck"] == "input-bound"
    assert [s["step"] for s in data["steps"]] == list(range(4, 13))
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads(paths["trace"].read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert "local /host:CPU" in names
    assert any(e.get("name") == "IteratorGetNextOp::DoCompute" and e.get("ph") == "X" for e in trace["traceEvents"])


def test_capture_records_only_the_chosen_steps_of_a_custom_loop(tmp_path):
    import tensorflow as tf

    from tensorfleet import profiling
    from tensorfleet.profiling.xspace import task_traces

    variable = tf.Variable(1.0)
    with profiling.capture(tmp_path, steps="2-4", task="worker-3") as cap:
        for step in range(7):
            with cap.step(step):
                variable.assign_add(tf.reduce_sum(tf.random.normal((64, 64))))
        assert not cap.running
    (trace,) = task_traces(tmp_path)
    assert trace.task == "worker-3"
    assert [s.number for s in trace.steps] == [2, 3, 4] == cap.recorded


def test_the_callback_counts_steps_across_epochs_and_records_them_whole(tmp_path):
    import numpy as np
    import tensorflow as tf

    from tensorfleet import profiling
    from tensorfleet.profiling.xspace import task_traces

    model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.ones((8, 2), "float32"))).batch(2)
    callback = profiling.ProfileCallback(tmp_path, steps="3-5", task="worker-0")
    model.fit(data.repeat(), steps_per_epoch=4, epochs=3, verbose=0, callbacks=[callback])
    assert not callback.capture.running
    (trace,) = task_traces(tmp_path)
    # fit numbers steps within each epoch: global steps 3, 4, 5 are epoch 0's step 3, epoch 1's 0 and 1
    assert [s.number for s in trace.steps] == [3, 0, 1]


def test_a_task_folder_or_a_single_capture_folder_reads_as_one_task(recorded):
    from tensorfleet.profiling.xspace import find_traces

    logdir, _ = recorded
    (run,) = (logdir / "local" / "plugins" / "profile").iterdir()
    (pb,) = run.glob("*.xplane.pb")
    assert find_traces(logdir) == {"local": [pb]}
    assert find_traces(logdir / "local") == {"local": [pb]}
    assert find_traces(run) == {run.name: [pb]}


def test_a_keras3_fit_with_the_same_sleep_is_judged_input_bound_with_its_steps(tmp_path, keras3):
    from tensorfleet import profiling
    from tests.profiling.slow_worker_job import sleepy_dataset

    model = keras3.Sequential([keras3.Input((32,)), keras3.layers.Dense(64, activation="relu"),
                               keras3.layers.Dense(10)])
    model.compile(optimizer="sgd", loss=keras3.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = profiling.ProfileCallback(tmp_path / "profile", steps="3-12")
    model.fit(sleepy_dataset(SLEEP_MS / 1000), steps_per_epoch=15, epochs=1, verbose=0, shuffle=False,
              callbacks=[callback])
    profile = profiling.analyze(tmp_path / "profile")
    (task,) = profile.tasks
    assert (task.task, task.steps) == ("local", 9)  # steps 4-12: the first recorded one is left out
    assert statistics.median(row.input_ms for row in profile.steps) == pytest.approx(SLEEP_MS, rel=0.15)
    assert profile.verdict.bottleneck is profiling.Bottleneck.INPUT
    paths = profiling.write_report(profile, tmp_path / "report")
    assert [s["step"] for s in json.loads(paths["json"].read_text())["steps"]] == list(range(4, 13))
