"""An unmodified script run under tensorfleet.profiling.autorun, as a launcher would run each task."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import keras2_env

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    x, y = np.ones((12, 4), "float32"), np.ones((12, 2), "float32")
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)  # a second fit is not recorded
    with open(sys.argv[1], "w") as f:
        json.dump({"argv": sys.argv, "path0": sys.path[0]}, f)
""")


@pytest.mark.slow
def test_the_first_fit_of_an_unmodified_script_records_the_chosen_steps(tmp_path):
    from tensorfleet.profiling.xspace import find_traces, task_traces

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = keras2_env(TENSORFLEET_PROFILE_STEPS="2-3", TENSORFLEET_PROFILE_DIR=str(tmp_path / "profile"))
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "tensorfleet.profiling.autorun", str(script),
                           str(tmp_path / "out.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "out.json").read_text()) == {
        "argv": [str(script), str(tmp_path / "out.json")], "path0": str(tmp_path)}
    assert {task: len(files) for task, files in find_traces(tmp_path / "profile").items()} == {"local": 1}
    assert len(list((tmp_path / "profile" / "local" / "plugins" / "profile").iterdir())) == 1
    (trace,) = task_traces(tmp_path / "profile")
    assert [s.number for s in trace.steps] == [2, 3]


def test_without_the_variable_nothing_is_installed():
    from tensorfleet.profiling.autorun import install

    assert install({}) is False


KERAS3_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import keras

    assert keras.__version__.startswith("3."), keras.__version__
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((12, 4), "float32"), np.ones((12, 2), "float32")
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)  # a second fit is not recorded
    open(sys.argv[1], "w").write(type(model).__module__)
""")


@pytest.mark.slow
def test_the_first_keras3_fit_of_a_users_script_records_the_chosen_steps(tmp_path, keras3):
    from tensorfleet.profiling.xspace import find_traces, task_traces
    from tests.conftest import user_env

    script = tmp_path / "train.py"
    script.write_text(KERAS3_SCRIPT)
    env = user_env(TENSORFLEET_PROFILE_STEPS="2-3", TENSORFLEET_PROFILE_DIR=str(tmp_path / "profile"))
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "tensorfleet.profiling.autorun", str(script), str(tmp_path / "out")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out").read_text() == "keras.src.models.sequential"
    assert {task: len(files) for task, files in find_traces(tmp_path / "profile").items()} == {"local": 1}
    (trace,) = task_traces(tmp_path / "profile")
    assert [s.number for s in trace.steps] == [2, 3]
