"""One process of a distributed search: Keras Tuner's chief oracle or one of its tuner workers.

Run as ``python -m tensorfleet.tuning.task OUT`` with Keras Tuner's own settings in the
environment: ``KERASTUNER_TUNER_ID`` (``chief`` for the oracle, ``tuner0``, ``tuner1``, ... for
the workers), ``KERASTUNER_ORACLE_IP`` and ``KERASTUNER_ORACLE_PORT``. The options come from
``OUT/search.json``. Both roles build the same Keras Tuner tuner (``RandomSearch``,
``BayesianOptimization`` or ``Hyperband``) over ``OUT/oracle``; a worker then runs
``tuner.search``, which Keras Tuner turns into asking the chief for trials over gRPC, and
trains each trial under the search's tensorfleet strategy; the chief serves the oracle
(:mod:`tensorfleet.tuning.chief`).

Keras Tuner drives the Keras it chose when it was imported (:mod:`tensorfleet.compat.keras_tuner`):
Keras 3 (``import keras``) in a process whose environment has no ``TF_USE_LEGACY_KERAS``, its own
choice beside Keras 3; tf_keras where the user set ``TF_USE_LEGACY_KERAS=1`` for the search. Every
process of a search inherits the environment of the one that started it, so a tf_keras search is
started as ``TF_USE_LEGACY_KERAS=1 tensorfleet tune ...``. ``build_model`` is checked at its first
build to return models of that Keras (:func:`checked_hypermodel`); the other Keras is refused with
one error that names the fix (:class:`TunerKerasError`).

Errors in what the user gave (a script without ``build_model``, an objective the model does not
report) are printed as one line starting with :data:`ERROR_MARK` (:data:`KERAS_MARK` for a model of
the other Keras) and end the process with status :data:`EXIT_USER_ERROR`; the supervisor ends the
search with that message.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any, Callable

# TunerKerasError lives in config: this module also runs as __main__, where a class of its own would be another
# class than the one the chief's make_tuner (imported from tensorfleet.tuning.task) raises.
from tensorfleet.tuning.config import SearchAlgorithm, SearchConfig, TunerKerasError, missing_functions_message

__all__ = ["CONFIG_ENV", "ERROR_MARK", "EXIT_USER_ERROR", "KERAS_MARK", "MARK", "TuneScriptError", "TunerKerasError",
           "checked_hypermodel", "main", "make_tuner", "load_script", "split_data"]

MARK = "tensorfleet-tune:"
ERROR_MARK = "tensorfleet-tune-error:"
# the same, for a script whose models are of the Keras Keras Tuner does not drive
KERAS_MARK = "tensorfleet-tune-keras:"
EXIT_USER_ERROR = 3
PROJECT = "oracle"
IDLE_PAUSE = 0.5
CONFIG_ENV = "TENSORFLEET_TUNE_CONFIG"


class TuneScriptError(ValueError):
    """What the user's script or options give cannot be searched (reported, not retried)."""


_HOW = {  # by the Keras of the model built: why Keras Tuner drives the other here, and the two ways out
    "keras3": "Keras Tuner drives tf_keras (Keras 2) in this search, because TF_USE_LEGACY_KERAS=1 is set in its "
              "environment. Start the search without TF_USE_LEGACY_KERAS (Keras Tuner then drives Keras 3, its own "
              "choice), or build the model with tf_keras (`import tf_keras as keras`).",
    "keras2": "Keras Tuner drives Keras 3 in this search (it does whenever Keras 3 is installed, "
              "keras-team/keras-tuner#1039). Build the model with `import keras` (Keras 3), or start the search "
              "with TF_USE_LEGACY_KERAS=1 in its environment (`TF_USE_LEGACY_KERAS=1 tensorfleet tune ...`), which "
              "makes tf.keras tf_keras and Keras Tuner drive it.",
}


def say(text: str) -> None:
    print(f"{MARK} {text}", flush=True)


def load_script(path: str) -> dict[str, Callable[..., Any]]:
    """The script's ``build_model`` and ``data``, run as a module that is not ``__main__``."""
    namespace = runpy.run_path(path, run_name="__tensorfleet_tune__")
    missing = [name for name in ("build_model", "data") if not callable(namespace.get(name))]
    if missing:
        raise TuneScriptError(missing_functions_message(path, missing))
    return {"build_model": namespace["build_model"], "data": namespace["data"]}


def split_data(data: Any, batch_size: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``data()``'s result as the arguments of ``tuner.search``."""
    if isinstance(data, (tuple, list)) and len(data) == 4:
        x, y, x_val, y_val = data
        return (x, y), {"validation_data": (x_val, y_val), "batch_size": batch_size}
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return (data[0],), {"validation_data": data[1]}
    shape = f"a {type(data).__name__} of {len(data)}" if isinstance(data, (tuple, list)) else type(data).__name__
    raise TuneScriptError("data() must return (x, y, x_val, y_val) or (train_dataset, val_dataset). "
                          f"Received: {shape}")


def _objective(config: SearchConfig) -> Any:
    from tensorfleet.compat.keras_tuner import import_keras_tuner, objective_from_name

    kt = import_keras_tuner()
    if config.direction is not None:
        return kt.Objective(config.objective, config.direction.value)
    try:
        return objective_from_name(config.objective)
    except ValueError:
        raise TuneScriptError(
            f"Keras Tuner cannot tell whether objective {config.objective!r} is better larger or smaller; "
            "pass --direction max or --direction min.") from None


def checked_hypermodel(build_model: Callable[..., Any], where: str = "build_model") -> Callable[..., Any]:
    """``build_model``, checked at its first build to return a model of the Keras that Keras Tuner drives
    here (:func:`~tensorfleet.compat.keras_tuner.tuner_keras`: Keras 3, or tf_keras where the process set
    ``TF_USE_LEGACY_KERAS=1``).

    Keras Tuner builds the model once as the tuner is made (to learn the search space), in the chief
    and in every worker, so a script that builds models of the other Keras is refused before any trial
    runs (Keras Tuner itself would record each trial as failed, with an error that does not say why).

    Raises:
        TunerKerasError: the first model built is of the other Keras (the message names the fix).
        TypeError: the first thing built is not a Keras model.
    """
    from tensorfleet.compat.keras import keras_of
    from tensorfleet.compat.keras_tuner import import_keras_tuner, tuner_keras

    kt = import_keras_tuner()
    # Keras Tuner records most errors of a build as a failed trial and goes on; its FatalError ends the
    # search. Raised as both, the refusal ends it and is still caught as a TunerKerasError.
    fatal = type("TunerKerasError", (TunerKerasError, kt.errors.FatalError), {})
    driven = tuner_keras()
    checked = False

    def build(hp: Any) -> Any:
        nonlocal checked
        model = build_model(hp)
        if not checked:
            built = keras_of(model, where)
            if built is not driven:
                kind = "a Keras 3" if built.value == "keras3" else "a tf_keras (Keras 2)"
                raise fatal(f"{where} returned {kind} model ({type(model).__module__}.{type(model).__qualname__}), "
                            f"but {_HOW[built.value]}")
            checked = True
        return model

    return build


def make_tuner(config: SearchConfig, build_model: Callable[..., Any], *, strategy: Any = None) -> Any:
    """Keras Tuner's tuner of ``config.algorithm`` over ``OUT/oracle``, reloading what is there.

    Raises:
        TunerKerasError: ``build_model`` returns models of the Keras Keras Tuner does not drive here.
    """
    from tensorfleet.compat.keras_tuner import import_keras_tuner

    kt = import_keras_tuner()
    common = {"hypermodel": checked_hypermodel(build_model, f"build_model of {Path(config.script).name}"),
              "objective": _objective(config), "directory": config.out_dir, "project_name": PROJECT, "overwrite": False,
              "distribution_strategy": strategy, "seed": config.seed}
    if config.algorithm is SearchAlgorithm.HYPERBAND:
        tuner = kt.Hyperband(max_epochs=config.epochs, **common)
        tuner.oracle.max_trials = config.max_trials  # Keras Tuner's own cap on created trials
    elif config.algorithm is SearchAlgorithm.BAYESIAN:
        tuner = kt.BayesianOptimization(max_trials=config.max_trials, **common)
    else:
        tuner = kt.RandomSearch(max_trials=config.max_trials, **common)
    _save_atomically(tuner)
    return tuner


def _save_atomically(tuner: Any) -> None:
    """Keras Tuner writes each process's own state (``OUT/oracle/<tuner id>.json``, reloaded when
    that process starts again) in place: one killed while writing it, or stopped with the search,
    would leave half a file that a ``--resume`` then fails to read. Written atomically instead."""
    from tensorfleet.compat.keras_tuner import tuner_is_worker, tuner_state_file
    from tensorfleet.io import write_json

    def save() -> None:
        if not tuner_is_worker(tuner):
            tuner.oracle.save()
        write_json(tuner_state_file(tuner), tuner.get_state())

    tuner.save = save


def _objective_check(name: str) -> Any:
    from tensorfleet.compat.keras import keras_module
    from tensorfleet.compat.keras_tuner import import_keras_tuner, tuner_keras

    kt = import_keras_tuner()

    # A callback of the Keras that trains; its base class is known only when the search runs.
    class ObjectiveCheck(keras_module(tuner_keras()).callbacks.Callback):  # type: ignore[misc]
        """Ends the search after the first epoch when the model does not report the objective; says
        when each epoch begins (a line the supervisor keeps, shown with --verbose)."""

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            print(f"epoch {epoch + 1}/{self.params.get('epochs')} begins", flush=True)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if name not in (logs or {}):
                reported = ", ".join(sorted(logs or {})) or "nothing"
                raise kt.errors.FatalError(
                    f"The model does not report the objective {name!r}; it reports: {reported}. Choose one of "
                    "these with --objective, or compile the model with the metric (validation metrics need data() "
                    "to return validation data).")

    return ObjectiveCheck()


def _paced(client: Any, tuner_id: str) -> None:
    """Announces each trial this worker runs, and waits a little when the oracle says IDLE (a
    Hyperband bracket waiting for others' trials) instead of asking again at once."""
    create = client.create_trial

    def create_trial(tuner_id_: str) -> Any:
        trial = create(tuner_id_)
        if trial.status == "RUNNING":
            say(f"{tuner_id} runs trial {trial.trial_id}")
        elif trial.status == "IDLE":
            time.sleep(IDLE_PAUSE)
        return trial

    client.create_trial = create_trial


def run_worker(config: SearchConfig, script: dict[str, Callable[..., Any]], tuner_id: str) -> None:
    from tensorfleet.strategies.registry import build

    strategy = build(config.strategy, **({"announce": False} if config.strategy == "auto" else {}))
    tuner = make_tuner(config, script["build_model"], strategy=strategy)
    say(f"{tuner_id} trains each trial under {config.strategy} over {strategy.num_replicas_in_sync} replica(s)")
    _paced(tuner.oracle, tuner_id)
    args, kwargs = split_data(script["data"](), config.batch_size)
    tuner.search(*args, epochs=config.epochs, callbacks=[_objective_check(config.objective)], verbose=0, **kwargs)
    say(f"{tuner_id} done")


def _pin(tuner_id: str) -> None:
    index = int(tuner_id.removeprefix("tuner") or 0)
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[index % len(cores)]})
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    tuner_id = os.environ["KERASTUNER_TUNER_ID"]
    chief = "chief" in tuner_id
    given = os.environ.get(CONFIG_ENV)  # on Kubernetes, the manifests carry the options
    config = SearchConfig(**json.loads(given)) if given else SearchConfig.load(Path(argv[0]))
    if given and chief:
        config.save()
    from tensorfleet.compat.keras_tuner import import_keras_tuner

    kt = import_keras_tuner()  # before the user's script, which may import keras_tuner itself

    try:
        if not chief and config.pin_cores:  # first: TensorFlow takes thread counts only before it starts
            _pin(tuner_id)
        if not chief and config.devices_per_trial > 1:
            from tensorfleet.strategies.devices import simulate_devices

            simulate_devices(config.devices_per_trial)
        script = load_script(config.script)
        if chief:
            from tensorfleet.tuning.chief import run_chief

            run_chief(config, script["build_model"])
        else:
            run_worker(config, script, tuner_id)
    except TunerKerasError as exc:
        print(f"{KERAS_MARK} {exc}", flush=True)
        return EXIT_USER_ERROR
    except (TuneScriptError, kt.errors.FatalError) as exc:
        print(f"{ERROR_MARK} {exc}", flush=True)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
