"""Keras Tuner's Keras (tensorfleet.compat.keras_tuner): Keras 3, its own choice, in a user's process (as this suite's
is); tf_keras where the process set TF_USE_LEGACY_KERAS=1 (a child here); a hypermodel of the other Keras refused naming
the fix."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest


def _keras3() -> object:
    """The Keras 3 package, where it is installed beside tf_keras (the current track)."""
    keras = pytest.importorskip("keras", reason="Keras 3 is not installed (the tff track has Keras 2.14)")
    if not keras.__version__.startswith("3."):
        pytest.skip(f"keras {keras.__version__} is Keras 2 (the tff track): nothing for Keras Tuner to choose")
    return keras


def _run(code: str, *, legacy: bool = False) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter (Keras Tuner chooses its Keras once per process), as a user runs it: with
    ``TF_USE_LEGACY_KERAS=1`` when ``legacy`` (a tf_keras user's choice), else without it."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "KERASTUNER_TUNER_ID",
                                                               "KERASTUNER_ORACLE_IP", "KERASTUNER_ORACLE_PORT")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def _tuners_keras() -> object:
    """The Keras module whose models the Keras Tuner of this process takes: Keras 3 in this suite's process (a
    user's default one) on the current track, tf.keras (Keras 2.14) on the tff track."""
    from tensorfleet.compat.keras import keras_module
    from tensorfleet.compat.keras_tuner import import_keras_tuner, tuner_keras

    import_keras_tuner()
    return keras_module(tuner_keras())


def _build_in(keras):
    def build_model(hp):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(hp.Choice("units", [2, 3])),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model
    return build_model


def test_keras_tuner_searches_models_of_the_keras_it_drives(tmp_path):
    from tensorfleet.compat.keras_tuner import import_keras_tuner

    keras = _tuners_keras()
    tuner = import_keras_tuner().RandomSearch(_build_in(keras), objective="val_loss", max_trials=2, seed=0,
                                              directory=str(tmp_path), project_name="p")
    x = np.linspace(0.0, 1.0, 32, dtype="float32").reshape(8, 4)
    y = x.sum(axis=1, keepdims=True)
    tuner.search(x, y, validation_data=(x, y), epochs=1, verbose=0)
    trials = tuner.oracle.trials.values()
    assert sorted(t.status for t in trials) == ["COMPLETED", "COMPLETED"]
    assert all(np.isfinite(t.score) for t in trials)
    assert isinstance(tuner.get_best_models(1)[0], keras.Model)


@pytest.mark.slow
def test_keras_tuner_drives_keras_3_in_a_users_process_and_tf_keras_where_the_user_chose_it():
    _keras3()
    probe = ("import tensorfleet\n"
             "from tensorfleet.compat.keras_tuner import prefer_keras2, search_keras, tuner_keras\n"
             "before = search_keras().value\n"
             "chose = prefer_keras2()\n"
             "import keras_tuner, tensorflow as tf\n"
             "print(before, chose, tuner_keras().value, tf.keras.Model.__module__)")
    user = _run(probe)  # import tensorfleet changes nothing: Keras Tuner takes Keras 3, as it does alone
    assert user.returncode == 0, user.stderr[-3000:]
    assert user.stdout.split() == ["keras3", "False", "keras3", "keras.src.models.model"]
    legacy = _run(probe, legacy=True)
    assert legacy.returncode == 0, legacy.stderr[-3000:]
    assert legacy.stdout.split() == ["keras2", "True", "keras2", "tf_keras.src.engine.training"]


@pytest.mark.slow
def test_keras_tuner_imported_first_in_a_tf_keras_process_is_refused_naming_the_order():
    _keras3()
    done = _run("import keras_tuner\n"
                "from tensorfleet.compat.keras_tuner import KerasTunerBackendError, drives_keras2, import_keras_tuner\n"
                "import_keras_tuner(models=False)  # an oracle alone takes either Keras\n"
                "try:\n"
                "    import_keras_tuner()\n"
                "except KerasTunerBackendError as exc:\n"
                "    print(drives_keras2(), exc)", legacy=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == (
        "False Keras Tuner was imported before tensorfleet.compat.keras_tuner.import_keras_tuner() and chose Keras 3 "
        "(it does whenever the `keras` package is Keras 3), so it would refuse the tf_keras models this process chose "
        "with TF_USE_LEGACY_KERAS=1. Call import_keras_tuner() before `import keras_tuner`, run the search in a new "
        "process, or unset TF_USE_LEGACY_KERAS and build Keras 3 models (`import keras`).")


def _search_config(tmp_path):
    from tensorfleet.tuning.config import SearchConfig

    script = tmp_path / "search.py"
    script.write_text("def build_model(hp):\n    pass\n\ndef data():\n    pass\n")
    return SearchConfig(script=str(script), out_dir=str(tmp_path / "out"), workers=1, max_trials=2)


LEGACY_TUNER = """\
import json, sys
import numpy as np
import keras, tf_keras
from tensorfleet.compat.keras_tuner import drives_keras2, import_keras_tuner
from tensorfleet.tuning.config import SearchConfig
from tensorfleet.tuning.task import TunerKerasError, make_tuner

def build(module):
    def build_model(hp):
        model = module.Sequential([module.Input((4,)), module.layers.Dense(hp.Choice("units", [2, 3])),
                                   module.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model
    return build_model

kt = import_keras_tuner()
tuner = kt.RandomSearch(build(tf_keras), objective="val_loss", max_trials=2, seed=0, directory=sys.argv[2],
                        project_name="p")
x = np.linspace(0.0, 1.0, 32, dtype="float32").reshape(8, 4)
y = x.sum(axis=1, keepdims=True)
tuner.search(x, y, validation_data=(x, y), epochs=1, verbose=0)
trials = tuner.oracle.trials.values()
print(drives_keras2(), sorted(t.status for t in trials), all(np.isfinite(t.score) for t in trials),
      isinstance(tuner.get_best_models(1)[0], tf_keras.Model))
try:
    make_tuner(SearchConfig(**json.loads(sys.argv[1])), build(keras))
except TunerKerasError as exc:
    print(exc)
"""


@pytest.mark.slow
def test_keras_tuner_searches_tf_keras_models_where_the_user_chose_tf_keras_and_refuses_keras_3_ones(tmp_path):
    _keras3()
    import json

    config = _search_config(tmp_path)
    given = {"script": config.script, "out_dir": config.out_dir, "workers": 1, "max_trials": 2}
    done = subprocess.run([sys.executable, "-c", LEGACY_TUNER, json.dumps(given), str(tmp_path / "search")],
                          env={k: v for k, v in os.environ.items() if not k.startswith("KERASTUNER")}
                          | {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    searched, refused = done.stdout.strip().splitlines()
    assert searched == "True ['COMPLETED', 'COMPLETED'] True True"
    assert refused == (
        "build_model of search.py returned a Keras 3 model (keras.src.models.sequential.Sequential), but Keras Tuner "
        "drives tf_keras (Keras 2) in this search, because TF_USE_LEGACY_KERAS=1 is set in its environment. Start the "
        "search without TF_USE_LEGACY_KERAS (Keras Tuner then drives Keras 3, its own choice), or build the model "
        "with tf_keras (`import tf_keras as keras`).")


USER_TUNER = """\
import json, sys
import keras, tf_keras
from tensorfleet.tuning.config import SearchConfig
from tensorfleet.tuning.task import TunerKerasError, make_tuner

def build(module):
    def build_model(hp):
        model = module.Sequential([module.Input((4,)), module.layers.Dense(hp.Choice("units", [2, 3]))])
        model.compile(optimizer="sgd", loss="mse")
        return model
    return build_model

config = SearchConfig(**json.loads(sys.argv[1]))
tuner = make_tuner(config, build(keras))
print(type(tuner.hypermodel.build(tuner.oracle.get_space())).__module__)
try:
    make_tuner(SearchConfig(**{**json.loads(sys.argv[1]), "out_dir": config.out_dir + "2"}), build(tf_keras))
except TunerKerasError as exc:
    print(exc)
"""


@pytest.mark.slow
def test_a_keras_3_hypermodel_is_keras_tuners_own_case_in_a_users_process(tmp_path):
    _keras3()
    import json

    config = _search_config(tmp_path)
    given = {"script": config.script, "out_dir": config.out_dir, "workers": 1, "max_trials": 2}
    done = subprocess.run([sys.executable, "-c", USER_TUNER, json.dumps(given)],
                          env={k: v for k, v in os.environ.items() if not k.startswith(("TF_USE_LEGACY", "KERASTUNER"))}
                          | {"TF_CPP_MIN_LOG_LEVEL": "3"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    accepted, refused = done.stdout.strip().splitlines()
    assert accepted == "keras.src.models.sequential"
    assert refused == (
        "build_model of search.py returned a tf_keras (Keras 2) model (tf_keras.src.engine.sequential.Sequential), "
        "but Keras Tuner drives Keras 3 in this search (it does whenever Keras 3 is installed, "
        "keras-team/keras-tuner#1039). Build the model with `import keras` (Keras 3), or start the search with "
        "TF_USE_LEGACY_KERAS=1 in its environment (`TF_USE_LEGACY_KERAS=1 tensorfleet tune ...`), which makes "
        "tf.keras tf_keras and Keras Tuner drive it.")


def test_a_hypermodel_is_checked_at_its_first_build_only(tmp_path, monkeypatch):
    from tensorfleet.compat.keras_tuner import import_keras_tuner
    from tensorfleet.tuning.task import checked_hypermodel

    built = []

    def build_model(hp):
        built.append(hp)
        return _build_in(keras)(hp) if len(built) == 1 else "not a model"

    keras = _tuners_keras()
    build = checked_hypermodel(build_model, "probe")
    hp = import_keras_tuner().HyperParameters()
    assert isinstance(build(hp), keras.Model)
    assert build(hp) == "not a model"  # later builds are Keras Tuner's to check, as it does
    with pytest.raises(TypeError, match=r"^probe takes a Keras model \(Keras 3 or tf_keras\)\. "
                                        r"Received: model of type str$"):
        checked_hypermodel(lambda hp: "not a model", "probe")(hp)
