"""Keras Tuner on tf_keras beside Keras 3 (tensorfleet.compat.keras_tuner), and the refusal of Keras 3 models."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet.compat.keras import Keras3ModelError


def _keras3() -> object:
    """The Keras 3 package, where it is installed beside tf_keras (the current track)."""
    keras = pytest.importorskip("keras", reason="Keras 3 is not installed (the tff track has Keras 2.14)")
    if not keras.__version__.startswith("3."):
        pytest.skip(f"keras {keras.__version__} is Keras 2 (the tff track): nothing for Keras Tuner to choose")
    return keras


def _run(code: str) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter (Keras Tuner chooses its Keras once per process), as a user runs it."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "KERASTUNER_TUNER_ID",
                                                               "KERASTUNER_ORACLE_IP", "KERASTUNER_ORACLE_PORT")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def _tf_keras_build(hp):
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(hp.Choice("units", [2, 3])),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_keras_tuner_searches_tf_keras_models_with_keras_3_installed(tmp_path):
    from tensorfleet.compat.keras_tuner import drives_keras2, import_keras_tuner

    kt = import_keras_tuner()
    assert drives_keras2()
    tuner = kt.RandomSearch(_tf_keras_build, objective="val_loss", max_trials=2, seed=0, directory=str(tmp_path),
                            project_name="p")
    x = np.linspace(0.0, 1.0, 32, dtype="float32").reshape(8, 4)
    y = x.sum(axis=1, keepdims=True)
    tuner.search(x, y, validation_data=(x, y), epochs=1, verbose=0)
    trials = tuner.oracle.trials.values()
    assert sorted(t.status for t in trials) == ["COMPLETED", "COMPLETED"]
    assert all(np.isfinite(t.score) for t in trials)
    assert isinstance(tuner.get_best_models(1)[0], tf.keras.Model)  # tf_keras here, Keras 2.14 on the tff track


def test_a_user_import_after_tensorfleet_takes_tf_keras_models():
    _keras3()
    done = _run("import tensorfleet\n"
                "from tensorfleet.compat.keras_tuner import drives_keras2, prefer_keras2\n"
                "assert prefer_keras2()\n"
                "import keras_tuner as kt, tensorflow as tf\n"
                "print(drives_keras2(), tf.keras.Model.__module__)")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "tf_keras.src.engine.training"]


def test_keras_tuner_imported_before_tensorfleet_is_refused_naming_the_order():
    _keras3()
    done = _run("import keras_tuner\n"
                "import tensorfleet\n"
                "from tensorfleet.compat.keras_tuner import KerasTunerBackendError, drives_keras2, import_keras_tuner\n"
                "import_keras_tuner(models=False)  # an oracle alone takes either Keras\n"
                "try:\n"
                "    import_keras_tuner()\n"
                "except KerasTunerBackendError as exc:\n"
                "    print(drives_keras2(), exc)")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == (
        "False Keras Tuner was imported before tensorfleet and chose Keras 3 (it does whenever the `keras` package "
        "is Keras 3), so it would refuse the tf_keras models tensorfleet trains. Import tensorfleet before "
        "keras_tuner, or run the search in a new process.")


def _search_config(tmp_path):
    from tensorfleet.tuning.config import SearchConfig

    script = tmp_path / "search.py"
    script.write_text("def build_model(hp):\n    pass\n\ndef data():\n    pass\n")
    return SearchConfig(script=str(script), out=str(tmp_path / "out"), workers=1, max_trials=2)


def test_a_hypermodel_that_builds_a_keras_3_model_is_refused_as_the_tuner_is_made(tmp_path, monkeypatch):
    keras = _keras3()
    from tensorfleet.tuning.task import make_tuner

    monkeypatch.delenv("KERASTUNER_TUNER_ID", raising=False)
    monkeypatch.delenv("KERASTUNER_ORACLE_IP", raising=False)

    def build_model(hp):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(hp.Choice("units", [2, 3]))])
        model.compile(optimizer="sgd", loss="mse")
        return model

    with pytest.raises(Keras3ModelError, match=r"^build_model of search\.py runs Keras 2 \(tf_keras\) models only for now, and received a Keras 3 model "
                                               r"\(keras\.src\.models\.sequential\.Sequential\)\. tensorfleet runs "
                                               r"Keras 2 models"):
        make_tuner(_search_config(tmp_path), build_model)


def test_a_hypermodel_is_checked_at_its_first_build_only(tmp_path, monkeypatch):
    from tensorfleet.compat.keras_tuner import import_keras_tuner
    from tensorfleet.tuning.task import keras2_hypermodel

    built = []

    def build_model(hp):
        built.append(hp)
        return _tf_keras_build(hp) if len(built) == 1 else "not a model"

    build = keras2_hypermodel(build_model, "probe")
    hp = import_keras_tuner().HyperParameters()
    assert isinstance(build(hp), tf.keras.Model)
    assert build(hp) == "not a model"  # later builds are Keras Tuner's to check, as it does
    with pytest.raises(TypeError, match=r"^probe takes a Keras model \(Keras 3 or tf_keras\)\. "
                                        r"Received: model of type str$"):
        keras2_hypermodel(lambda hp: "not a model", "probe")(hp)
