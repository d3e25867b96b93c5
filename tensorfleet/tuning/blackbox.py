"""A search over any function with Keras Tuner's oracle, in this process: each trial is one call.

For trials that are not a Keras ``fit`` (a federated simulation, a whole training job): the
caller declares the hyperparameters on Keras Tuner's ``HyperParameters`` and gives a function from
their values to the objective. Keras Tuner's ``RandomSearchOracle`` or
``BayesianOptimizationOracle`` proposes the values; its state is saved in ``OUT/oracle`` after
every trial, so running it again with the same ``out_dir`` continues a search that was stopped, with the trial that was
running run again. The results are those of :mod:`~tensorfleet.tuning.results`: the table,
JSON and plots (no model: the function owns what it trains).

Example:
    >>> def space(hp):
    ...     hp.Float("x", -2.0, 2.0)
    >>> result = search_function(lambda hp: (hp["x"] - 1) ** 2, space, objective="loss",
    ...                          direction="min", max_trials=5, out_dir="bb", log=lambda line: None)
    >>> len(result.trials), result.best.score == min(r.score for r in result.trials)
    (5, True)
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from tensorfleet.io import check_writable, write_json
from tensorfleet.tuning.chief import atomic_saves, repair_reloaded
from tensorfleet.tuning.config import Direction, SearchAlgorithm, check_saved_search, fresh_to_resume, should_resume
from tensorfleet.tuning.distributed import SearchResult
from tensorfleet.tuning.results import TrialRecord, best_record, write_results
from tensorfleet.validation import choice, integer, positive_int, renamed

__all__ = ["search_function"]

PROJECT = "oracle"
TUNER_ID = "tuner0"


def _oracle(algorithm: SearchAlgorithm, objective: Any, max_trials: int, seed: int) -> Any:
    from tensorfleet.compat.keras_tuner import import_keras_tuner

    kt = import_keras_tuner(models=False)

    if algorithm is SearchAlgorithm.HYPERBAND:
        raise ValueError("algorithm must be 'random' or 'bayesian' for a search over a function: Hyperband "
                         "needs trials that train for a number of epochs. Received: algorithm='hyperband'")
    oracle_class = kt.oracles.BayesianOptimizationOracle if algorithm is SearchAlgorithm.BAYESIAN \
        else kt.oracles.RandomSearchOracle
    return oracle_class(objective=objective, max_trials=max_trials, seed=seed)


def _prepare(out_dir: Path, resume: bool | None) -> bool:
    check_writable(out_dir / "results.json")
    if should_resume(out_dir, resume, saved=(out_dir / PROJECT / "oracle.json").exists()):
        check_saved_search(out_dir / PROJECT)
        return True
    shutil.rmtree(out_dir / PROJECT, ignore_errors=True)
    (out_dir / "times.json").unlink(missing_ok=True)
    return False


@renamed(out="out_dir", fresh=("resume", fresh_to_resume))
def search_function(function: Callable[[dict[str, Any]], float], space: Callable[[Any], None], *,
                    objective: str, direction: str, max_trials: int, out_dir: str | Path,
                    algorithm: str = "random", seed: int = 0, resume: bool | None = None,
                    log: Callable[[str], None] = print) -> SearchResult:
    """Searches the hyperparameters ``space`` declares for the best ``function`` value.

    Args:
        function: the values of one trial (a dict) -> the objective (a float; NaN or an exception
            records the trial as failed).
        space: declares the hyperparameters on a Keras Tuner ``HyperParameters`` (``hp.Float(...)``).
        objective, direction: the objective's name (for the table and plots) and ``max`` or ``min``.
        max_trials, out_dir, algorithm (``random`` or ``bayesian``), seed, resume: as for
            :func:`tensorfleet.tuning.distributed.search`.
        log: receives one line per trial begun and ended.
    """
    from tensorfleet.compat.keras_tuner import import_keras_tuner, set_project_dir

    kt = import_keras_tuner(models=False)  # trials are calls of a function, not Keras models
    positive_int("max_trials", max_trials)
    integer("seed", seed, minimum=0)
    direction = choice(Direction, "direction", direction).value
    out_dir = Path(out_dir)
    resume = _prepare(out_dir, resume)
    oracle = _oracle(choice(SearchAlgorithm, "algorithm", algorithm), kt.Objective(objective, direction),
                     max_trials, seed)
    set_project_dir(oracle, str(out_dir), PROJECT)
    atomic_saves(oracle)
    oracle.verbose = 0  # the lines given to log say what Keras Tuner's tables would
    if resume:
        oracle.reload()  # the trial that was running goes back to the queue
        repair_reloaded(oracle)
    hp = oracle.get_space()
    space(hp)
    oracle.update_space(hp)
    times_path = out_dir / "times.json"
    start = time.monotonic()
    times = json.loads(times_path.read_text()) if resume and times_path.exists() else {}
    while True:
        trial = oracle.create_trial(TUNER_ID)
        if trial.status != "RUNNING":
            break
        values = dict(trial.hyperparameters.values)
        log(f"trial {trial.trial_id} began: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                         for k, v in values.items()))
        began = time.time()
        try:
            value = float(function(values))
            trial.status = "COMPLETED" if math.isfinite(value) else "INVALID"
            if math.isfinite(value):
                oracle.update_trial(trial.trial_id, {objective: value})
        except Exception as exc:  # a failed trial is recorded, the search goes on
            value, trial.status, trial.message = float("nan"), "FAILED", f"{type(exc).__name__}: {exc}"
        oracle.end_trial(trial)
        oracle.save()  # Keras Tuner saved before it let go of the trial: a resume must not run it again
        runs = times.get(trial.trial_id, {}).get("runs", 0) + 1
        times[trial.trial_id] = {"start": began, "end": time.time(), "runs": runs, "tuner": TUNER_ID}
        write_json(times_path, times)
        best = best_record([TrialRecord.from_trial(t, {}) for t in oracle.trials.values()], direction)
        best_text = f"best {best.score:.4g} (trial {best.trial_id})" if best else "no best yet"
        log(f"trial {trial.trial_id} {oracle.get_trial(trial.trial_id).status.lower()}: "
            f"{trial.message or f'{objective}={value:.4g}'} | {len(oracle.end_order)}/{max_trials} done, {best_text}")
    order = [h.name for h in oracle.hyperparameters.space]
    records = [TrialRecord.from_trial(t, times.get(i, {}), order=order) for i, t in sorted(oracle.trials.items())]
    write_results(out_dir, records, objective=objective, direction=direction, best_model=None)
    return SearchResult(out_dir, objective, direction, records, best_record(records, direction), None,
                        time.monotonic() - start, 0)
