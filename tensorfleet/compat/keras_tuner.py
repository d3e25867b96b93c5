"""Keras Tuner's Keras, and the parts of its oracle and tuner tensorfleet reaches into.

Keras Tuner 1.4 decides once, as it is first imported, which Keras it drives:
``keras_tuner/src/backend/config.py`` imports ``keras`` and switches to Keras 3 ("multi-backend")
whenever that package is Keras 3, which it is beside every TensorFlow >= 2.16 (TensorFlow 2.21
depends on it). It reads no setting that says otherwise (keras-team/keras-tuner#1039; the pull
request that would read ``TF_USE_LEGACY_KERAS``, #1040, is unmerged in 1.4.8). Driving Keras 3 is
Keras Tuner's native case, and what a search whose ``build_model(hp)`` returns Keras 3 models needs;
nothing is changed for it. In Keras 3 mode Keras Tuner refuses tf_keras models, though ("Expected
the model-building function ... to return a valid Keras Model instance").

A process that chose tf_keras itself (``TF_USE_LEGACY_KERAS=1`` in its environment, the user's
choice; tensorfleet never sets it) gets a Keras Tuner that drives tf_keras from
:func:`import_keras_tuner`: its module flag ``_MULTI_BACKEND`` is set to False as the module is
loaded, before any other module of Keras Tuner reads it, which is the state Keras Tuner itself is
in on TensorFlow < 2.16: it then takes ``tf.keras`` (tf_keras) for its Keras. The flag can only be
chosen at that moment (the modules that read it define their Keras classes as they load), so a
Keras Tuner imported before, in Keras 3 mode, is refused with one clear error rather than patched
half-way. :func:`prefer_keras2` arranges it for any later ``import keras_tuner`` of such a process,
without importing anything. :func:`tuner_keras` says which Keras the imported Keras Tuner drives.

The rest are small named reaches into the oracle's and the tuner's private state, each with the
reason it is needed. Keras Tuner's public names (``keras_tuner.Objective``, ``keras_tuner.oracles``,
``keras_tuner.engine.trial.Trial``) are used directly elsewhere.

Example:
    >>> from tensorfleet.compat.keras_tuner import import_keras_tuner
    >>> kt = import_keras_tuner()                                   # doctest: +SKIP
    >>> tuner_keras()           # Keras 3 unless the process set TF_USE_LEGACY_KERAS=1  # doctest: +SKIP
    <Keras.KERAS3: 'keras3'>
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any, Sequence

from tensorfleet.compat.keras import Keras, legacy_keras_selected

__all__ = ["KerasTunerBackendError", "drives_keras2", "import_keras_tuner", "prefer_keras2", "objective_from_name",
           "servicer_stopped", "exit_chief", "add_oracle_servicer", "oracle_state_file", "trial_file",
           "replace_trial_saver", "retry_queue", "set_retry_queue", "set_project_dir", "tuner_is_worker",
           "search_keras", "tuner_keras", "tuner_state_file"]

_CONFIG = "keras_tuner.src.backend.config"
_LOCK = threading.Lock()


class KerasTunerBackendError(RuntimeError):
    """This process chose tf_keras (``TF_USE_LEGACY_KERAS=1``), but Keras Tuner was imported before
    :func:`import_keras_tuner` and drives Keras 3."""


class _Keras2Loader(importlib.abc.Loader):
    """Loads Keras Tuner's backend config as usual, then sets its Keras 3 flag to False."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        setattr(module, "_MULTI_BACKEND", False)  # what config.py computes itself when `keras` is Keras 2


class _Keras2Finder(importlib.abc.MetaPathFinder):
    """Finds Keras Tuner's backend config where the path finder does, with :class:`_Keras2Loader`."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _CONFIG:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Keras2Loader(spec.loader)
        return spec


def drives_keras2() -> bool:
    """Whether the imported Keras Tuner takes Keras 2 (tf_keras / TF < 2.16 ``tf.keras``) models."""
    config = sys.modules.get(_CONFIG)
    return config is not None and not config.multi_backend()


def tuner_keras() -> Keras:
    """The Keras whose models the imported Keras Tuner takes (:func:`import_keras_tuner` first)."""
    return Keras.KERAS2 if drives_keras2() else Keras.KERAS3


def search_keras() -> Keras:
    """The Keras a Keras Tuner imported in a process started with this process's environment will drive
    (without importing anything): tf_keras where ``TF_USE_LEGACY_KERAS=1`` is set or the ``keras`` package
    is Keras 2 (TensorFlow < 2.16), else Keras 3."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        keras2_package = int(version("keras").split(".")[0]) < 3
    except (PackageNotFoundError, ValueError):
        keras2_package = False
    return Keras.KERAS2 if legacy_keras_selected() or keras2_package else Keras.KERAS3


def prefer_keras2() -> bool:
    """Makes a Keras Tuner imported from now on in this process drive tf_keras, when this process
    selected tf_keras (``TF_USE_LEGACY_KERAS``); returns whether Keras Tuner will (or already does).

    Cheap (no import of TensorFlow or Keras Tuner): it adds a finder to ``sys.meta_path`` that loads
    Keras Tuner's backend config as usual and then sets its flag. Called by :func:`import_keras_tuner`;
    a tf_keras user may call it before their own ``import keras_tuner`` (``import tensorfleet`` does
    not: importing tensorfleet changes no library's Keras). Without ``TF_USE_LEGACY_KERAS`` it does
    nothing and returns False: Keras Tuner then drives Keras 3, as it does on its own.
    """
    with _LOCK:
        if "keras_tuner" in sys.modules:
            return drives_keras2()
        if not legacy_keras_selected():
            return False
        if not any(isinstance(finder, _Keras2Finder) for finder in sys.meta_path):
            sys.meta_path.insert(0, _Keras2Finder())
        return True


def import_keras_tuner(*, models: bool = True) -> ModuleType:
    """``keras_tuner``: driving Keras 3 (its own choice beside Keras 3), or tf_keras when this process
    selected tf_keras with ``TF_USE_LEGACY_KERAS=1``.

    Args:
        models: whether Keras Tuner will build and train Keras models here. Without models (an
            oracle proposing values for a function) either Keras suits, and a Keras Tuner already
            imported by the user is taken as it is.

    Raises:
        KerasTunerBackendError: ``models`` and Keras Tuner was imported before (by the caller's
            code, say) in Keras 3 mode, while this process selected tf_keras.
    """
    prefer_keras2()
    import keras_tuner

    if models and legacy_keras_selected() and not drives_keras2():
        raise KerasTunerBackendError(
            "Keras Tuner was imported before tensorfleet.compat.keras_tuner.import_keras_tuner() and chose Keras 3 "
            "(it does whenever the `keras` package is Keras 3), so it would refuse the tf_keras models this process "
            "chose with TF_USE_LEGACY_KERAS=1. Call import_keras_tuner() before `import keras_tuner`, run the search "
            "in a new process, or unset TF_USE_LEGACY_KERAS and build Keras 3 models (`import keras`).")
    return keras_tuner


def objective_from_name(name: str) -> Any:
    """Keras Tuner's ``Objective`` for a metric name, its direction inferred as Keras Tuner does for a
    string objective (``val_accuracy`` -> max, ``loss`` -> min); ValueError when it cannot tell.

    Private (``keras_tuner.src.engine.objective.create_objective``): the public ``Objective`` needs
    the direction, and the CLI should infer it exactly as Keras Tuner does when given a name.
    """
    import_keras_tuner(models=False)
    from keras_tuner.src.engine.objective import create_objective

    return create_objective(name)


def add_oracle_servicer(oracle: Any, server: Any) -> Any:
    """Adds Keras Tuner's own gRPC oracle servicer for ``oracle`` to ``server``; returns the servicer.

    Private (``keras_tuner.src.distribute.oracle_chief`` and ``keras_tuner.src.protos``): Keras
    Tuner only serves its oracle from inside ``search`` on the chief, in a loop that notices the end
    20 s late and keeps no trial times; tensorfleet runs the same servicer in a loop of its own.
    """
    import_keras_tuner(models=False)
    from keras_tuner.src import protos
    from keras_tuner.src.distribute import oracle_chief

    servicer = oracle_chief.OracleServicer(oracle)
    protos.get_service_grpc().add_OracleServicer_to_server(servicer, server)
    return servicer


def servicer_stopped(servicer: Any) -> bool:
    """Whether the servicer has told a worker to stop (its ``stop_triggered``, set by Keras Tuner)."""
    return bool(servicer.stop_triggered)


def exit_chief(oracle: Any) -> bool:
    """Keras Tuner's own test for a chief that may exit: no trial runs and no tuner is left.

    Private (``keras_tuner.src.distribute.oracle_chief.exit_chief``): the loop that serves the oracle
    ends on the same condition as Keras Tuner's.
    """
    from keras_tuner.src.distribute import oracle_chief

    return bool(oracle_chief.exit_chief(oracle))


def oracle_state_file(oracle: Any) -> str:
    """The file the oracle saves its state in (``OUT/oracle/oracle.json``).

    Private (``Oracle._get_oracle_fname``): tensorfleet writes that state atomically in its place.
    """
    return oracle._get_oracle_fname()


def trial_file(oracle: Any, trial_id: str) -> str:
    """The ``trial.json`` of trial ``trial_id`` in the oracle's project (``Oracle._get_trial_dir``)."""
    import os

    return os.path.join(oracle._get_trial_dir(trial_id), "trial.json")


def replace_trial_saver(oracle: Any, save: Any) -> None:
    """Makes the oracle save each trial with ``save(trial)``.

    Private (``Oracle._save_trial``): Keras Tuner writes ``trial.json`` in place; a chief killed while
    writing it would leave half a file that ``--resume`` then fails to read.
    """
    oracle._save_trial = save


def retry_queue(oracle: Any) -> list[str]:
    """The trials the oracle will hand out again first (``Oracle._retry_queue``; its saved state
    holds the same list as ``retry_queue``), read to repair a reloaded oracle."""
    return list(oracle._retry_queue)


def set_retry_queue(oracle: Any, queue: list[str]) -> None:
    """Replaces the oracle's retry queue (no public setter exists short of its whole state)."""
    oracle._retry_queue = list(queue)


def set_project_dir(oracle: Any, directory: str, project: str) -> None:
    """Gives a bare oracle (no tuner) its project directory, as a tuner does for its own oracle.

    Private (``Oracle._set_project_dir``): a search over a function uses the oracle alone, and its
    state and trials must still be saved for ``--resume``.
    """
    oracle._set_project_dir(directory, project)


def tuner_is_worker(tuner: Any) -> bool:
    """Whether ``tuner`` runs in Keras Tuner's distributed mode as a worker (``Tuner._is_worker``)."""
    return bool(tuner._is_worker())


def tuner_state_file(tuner: Any) -> str:
    """The file a tuner saves its own state in (``Tuner._get_tuner_fname``: ``OUT/oracle/<tuner id>.json``),
    which tensorfleet writes atomically instead."""
    return tuner._get_tuner_fname()
