"""Hyperparameter search with Keras Tuner in its own distributed mode.

:func:`search` (``tensorfleet tune``) starts Keras Tuner's chief oracle and N tuner workers as
processes on this machine, each trial trained under a tensorfleet strategy; a worker that dies
is started again and its trial runs again, and a search whose chief died resumes from the
oracle's saved state. The user's script defines ``build_model(hp)`` and ``data()``
(:mod:`~tensorfleet.tuning.config`); the results are a table, JSON, plots
(:mod:`~tensorfleet.tuning.results`) and the best model in the Keras format.

Example:
    >>> import tensorfleet as tfl
    >>> result = tfl.tuning.search("examples/tune_digits.py", workers=2, max_trials=4,
    ...                            out_dir="tune_out")                            # doctest: +SKIP
    >>> result.best.trial_id, result.best_model                                 # doctest: +SKIP
    ('2', PosixPath('tune_out/best_model.keras'))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorfleet.lazy import attach

__getattr__, _LAZY = attach(
    __name__,
    names={"SearchAlgorithm": "config", "SearchConfig": "config", "SearchResult": "distributed",
           "TrialRecord": "results",
           "TuningError": "distributed", "search": "distributed", "describe": "distributed", "tune_manifests": "k8s",
           "write_manifests": "k8s:write"},
    internal=("chief", "config", "distributed", "results", "task"),
)

if TYPE_CHECKING:  # what the lazy map above serves, for editors and type checkers (not run)
    from tensorfleet.tuning.config import SearchAlgorithm, SearchConfig
    from tensorfleet.tuning.distributed import SearchResult, TuningError, describe, search
    from tensorfleet.tuning.k8s import tune_manifests, write as write_manifests
    from tensorfleet.tuning.results import TrialRecord

__all__ = [*_LAZY]
