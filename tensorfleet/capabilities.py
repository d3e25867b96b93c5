"""What this environment can run: each feature of tensorfleet and whether its dependencies are here.

The README's compatibility matrix (feature x track) is checked against :func:`probe_all` on each
track by ``tests/test_capabilities.py``; ``tensorfleet info`` prints the same table for the
environment a user is in, with the reason for every feature that cannot run and how to get it.

Example:
    >>> from tensorfleet.capabilities import FEATURES
    >>> [feature.key for feature in FEATURES][:3]
    ['strategies', 'cluster', 'mesh-tf']
"""

from __future__ import annotations

import importlib
import platform
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Callable

__all__ = ["FEATURES", "Feature", "Probe", "probe", "probe_all", "versions"]


KERAS2_ONLY = "runs Keras 2 (tf_keras) models only, for now: see docs/keras.md"
NO_KERAS = "-"


@dataclass(frozen=True)
class Feature:
    """One row of the matrix: a key, what it is, a check that returns None or why it cannot run, and which
    Kerases its models may be written in: ``keras3``/``keras2`` are "" where it runs them, else why not
    (:data:`NO_KERAS` for a feature that takes no Keras model)."""

    key: str
    title: str
    check: Callable[[], str | None]
    keras3: str = ""
    keras2: str = ""


@dataclass(frozen=True)
class Probe:
    key: str
    title: str
    available: bool
    reason: str  # empty when available
    keras3: str = ""  # "yes", "-" (no Keras model), or why a Keras 3 model cannot run here
    keras2: str = ""


def _keras2() -> str | None:
    from tensorfleet.compat.keras import keras2

    try:
        keras2()
    except ImportError as error:
        return str(error)
    return None


def _module(name: str, package: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            importlib.import_module(name)
        except Exception as error:  # any import failure means the feature cannot run
            return f"`import {name}` failed ({type(error).__name__}: {error}); install {package}"
        return None

    return check


def _all(*checks: Callable[[], str | None]) -> Callable[[], str | None]:
    def check() -> str | None:
        for one in checks:
            reason = one()
            if reason:
                return reason
        return None

    return check


def _mesh_tf() -> str | None:
    from tensorfleet.compat.mesh_tf import import_mesh_tensorflow

    try:
        import_mesh_tensorflow()
    except ImportError as error:
        return str(error)
    return None


def _tfmot() -> str | None:
    from tensorfleet.compat.tfmot import import_tfmot

    try:
        import_tfmot()  # not importlib: tfmot's import would set TF_USE_LEGACY_KERAS in the user's process
    except Exception as error:  # any import failure means the feature cannot run
        return f"`import tensorflow_model_optimization` failed ({type(error).__name__}: {error}); install " \
               "tensorflow-model-optimization"
    return None


def _tf_distribute() -> str | None:
    return None  # TensorFlow's own runtime (tf.distribute, compiled functions), under either Keras


def _dtensor() -> str | None:
    import tensorflow as tf

    return None if hasattr(tf.experimental, "dtensor") else "this TensorFlow has no tf.experimental.dtensor"


def _tff() -> str | None:
    from tensorfleet.compat.tff import TFF_TRACK_HINT, tff_available

    return None if tff_available() else f"tensorflow-federated does not import here; {TFF_TRACK_HINT}"


def _litert() -> str | None:
    from tensorfleet.compat.litert import interpreter_source

    try:
        source = interpreter_source()
    except ImportError as error:
        return str(error)
    return None if source != "tensorflow" else "no ai-edge-litert or tflite-runtime: `pip install ai-edge-litert`"


def _keras_tuner() -> str | None:
    from tensorfleet.compat.keras_tuner import import_keras_tuner

    try:
        import_keras_tuner()
    except Exception as error:
        return f"Keras Tuner is not usable here ({type(error).__name__}: {error}); `pip install keras-tuner`"
    return None


def _profiler() -> str | None:
    from tensorfleet.compat.profiler import converter_name

    return None if converter_name() else "no profiler converter: `pip install xprof` (or tensorboard-plugin-profile)"


FEATURES: tuple[Feature, ...] = (
    Feature("strategies", "Strategies: Keras fit under tf.distribute", _tf_distribute),
    Feature("cluster", "Cluster: launcher, fault tolerance, elastic, TFJob", _module("tensorboard", "tensorboard")),
    Feature("mesh-tf", "Model parallel: Mesh-TensorFlow layouts", _all(_keras2, _mesh_tf), keras3=KERAS2_ONLY),
    Feature("dtensor", "Model parallel: DTensor mesh (Mesh.scope: fit, evaluate, predict, save), pipelines",
            _all(_keras2, _dtensor)),
    Feature("tensor-parallel", "Model parallel: tensor-parallel layers, ZeRO, planner splits",
            _all(_keras2, _dtensor), keras3=KERAS2_ONLY),
    Feature("federated", "Federated: compiled backend, algorithms, aggregators", _tf_distribute),
    Feature("federated-dp", "Federated: DP epsilon (dp-accounting)", _module("dp_accounting", "dp-accounting"),
            keras3=NO_KERAS, keras2=NO_KERAS),
    Feature("federated-tff", "Federated: tff backend, remote TFF workers, TFF ClientData", _tff,
            keras3="tensorflow-federated 0.87 takes Keras 2 models (the tff track's TensorFlow 2.14)"),
    Feature("edge", "Edge: TFLite conversion, quantization, decomposition, LiteRT check", _litert),
    Feature("edge-optimize", "Edge: QAT, pruning, clustering, distillation (tfmot for tf_keras; Keras 3 built in)",
            _all(_keras2, _tfmot)),
    Feature("edge-micro", "Edge: TFLite Micro validation, arena report, C sources",
            _module("tflite_micro", "tflite-micro"), keras3=NO_KERAS, keras2=NO_KERAS),
    Feature("serving", "Serving: TF Serving REST and gRPC APIs", _module("tensorflow_serving.apis.predict_pb2",
                                                                       "tensorflow-serving-api")),
    Feature("tuning", "Tuning: Keras Tuner search, side-car evaluation", _keras_tuner),
    Feature("profiling", "Profiling: traces and step-time reports", _profiler),
)


def _keras_cell(declared: str, installed: Callable[[], object]) -> str:
    if declared:
        return declared
    try:
        installed()
    except ImportError as error:
        return str(error)
    return "yes"


def probe(feature: Feature) -> Probe:
    """Runs ``feature``'s check: importing what it needs, nothing more; and for each Keras, whether the
    feature runs its models and the Keras is installed here."""
    from tensorfleet.compat.keras import keras2, keras3

    reason = feature.check() or ""
    return Probe(feature.key, feature.title, not reason, reason, _keras_cell(feature.keras3, keras3),
                 _keras_cell(feature.keras2, keras2))


def probe_all() -> list[Probe]:
    """Every feature's :class:`Probe`, in the order of :data:`FEATURES`."""
    return [probe(feature) for feature in FEATURES]


def versions() -> dict[str, str]:
    """Python's and the main libraries' versions in this environment ("-" where one is not installed)."""
    found = {"python": platform.python_version()}
    for package in ("tensorflow", "tf_keras", "keras", "tensorflow-federated", "ai-edge-litert", "tflite-runtime",
                    "tflite-micro", "keras-tuner", "tensorflow-model-optimization", "mesh-tensorflow"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "-"
    return found
