"""A distributed Keras Tuner search on this machine: the chief oracle and N tuner workers as
processes on 127.0.0.1, supervised.

Keras Tuner's own distributed mode does the search: each process is started with
``KERASTUNER_TUNER_ID``, ``KERASTUNER_ORACLE_IP`` and ``KERASTUNER_ORACLE_PORT`` (a free port
from portpicker) and runs :mod:`tensorfleet.tuning.task`. The processes are run and supervised
by the cluster's job machinery, as the launcher's are (:class:`~tensorfleet.cluster.processes.LocalJob`,
:class:`~tensorfleet.cluster.supervisor.Supervisor`): each leads its own process group and dies
with this one, faults (:func:`tensorfleet.testing.faults`) are injected the same way, SIGINT and SIGTERM reach every
process.

Faults: a worker that dies is started again alone with the same tuner ID, and Keras Tuner's
oracle gives a tuner that asks again under its ID the trial it was running, so that trial runs
again and the search completes (up to ``max_restarts`` restarts of tuners in the search). A
chief that dies ends the search with an error; ``resume=True`` starts a new chief over the
saved oracle, which runs the trials that were running again and the ones not yet begun.

Example:
    >>> result = search("examples/tune_digits.py", workers=2, max_trials=4)  # doctest: +SKIP
    >>> result.best.score, result.best.hyperparameters                      # doctest: +SKIP
    (0.9722, {'units': 64, 'learning_rate': 0.01})
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tensorfleet.cluster.contract import HUNG_STATUS, describe_exit
from tensorfleet.cluster.processes import JobMode, LocalJob, TaskProcess
from tensorfleet.cluster.supervisor import Supervisor, forwarded_signals
from tensorfleet.io import check_writable
from tensorfleet.strategies.tf_config import ClusterSpec
from tensorfleet.tuning.config import (
    CONFIG_FILE,
    SearchConfig,
    check_saved_search,
    check_script,
    enum_options,
    fresh_to_resume,
    should_resume,
)
from tensorfleet.tuning.results import TrialRecord, best_record, read_results
from tensorfleet.tuning.task import ERROR_MARK, KERAS_MARK, MARK, PROJECT, TunerKerasError
from tensorfleet.validation import renamed, renamed_fields

__all__ = ["SearchResult", "Supervision", "TrialOptions", "TuningError", "describe", "search"]

HOST = "127.0.0.1"
_TAIL = 15


class TuningError(RuntimeError):
    """The search could not finish (a chief that died, a worker that kept dying, a time-out)."""


@renamed_fields(out="out_dir")
@dataclass(frozen=True)
class SearchResult:
    """What a finished search left in ``out_dir``: its records, the best and the time it took."""

    out_dir: Path
    objective: str
    direction: str
    trials: list[TrialRecord]
    best: TrialRecord | None
    best_model: Path | None
    seconds: float
    restarts: int

    @property
    def completed(self) -> int:
        return sum(r.status == "COMPLETED" for r in self.trials)


class _SearchJob(LocalJob):
    """The processes of one search: the chief oracle (``chief:0``) and the tuners (``tuner:I``).

    The cluster's job machinery runs them (:class:`~tensorfleet.cluster.processes.LocalJob`,
    supervised by :class:`~tensorfleet.cluster.supervisor.Supervisor`): a tuner that dies is
    started again alone, with its tuner ID; a chief that dies, or an error a process reports
    about the user's script, ends the search.
    """

    name = "tune"

    def __init__(self, config: SearchConfig, *, log: Callable[[str], None], verbose: bool) -> None:
        import portpicker

        self.config, self.verbose = config, verbose
        self.port = portpicker.pick_unused_port()
        self.errors: list[Exception] = []  # what a process reported as the user's error, first first
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        spec = ClusterSpec.local(workers=config.workers, chief=True, host=HOST)
        super().__init__(spec=spec, mode=JobMode.PARAMETER_SERVER,
                         argv=[sys.executable, "-m", "tensorfleet.tuning.task", config.out_dir],
                         env=env, log=log, stop_when=None, verbose=verbose,
                         progress_interval=5.0)
        self.lead, self.trainers = "chief:0", {"chief:0"}  # when the oracle ends, the search is complete

    def on_progress(self, task: TaskProcess, text: str) -> None:
        if self.verbose:
            super().on_progress(task, text)

    def shown(self, task: TaskProcess, text: str) -> str | None:
        if text.startswith((ERROR_MARK, KERAS_MARK)):
            kind, mark = (TunerKerasError, KERAS_MARK) if text.startswith(KERAS_MARK) else (ValueError, ERROR_MARK)
            self.errors.append(kind(text[len(mark):].strip()))
            return None
        if text.startswith(MARK):
            return text[len(MARK):].strip()
        return text if self.verbose else None

    def restartable(self, task: str, code: int) -> bool:
        return not self.errors and task.startswith("tuner:") and code != HUNG_STATUS

    def restarts_alone(self, task: str, code: int) -> bool:
        return True  # the oracle gives a tuner that asks again under its ID the trial it was running

    def start_task(self, role: str, index: int, attempt: int) -> TaskProcess:
        env = dict(self.base_env)
        env.update(KERASTUNER_TUNER_ID="chief" if role == "chief" else f"tuner{index}",
                   KERASTUNER_ORACLE_IP=HOST, KERASTUNER_ORACLE_PORT=str(self.port), PYTHONUNBUFFERED="1")
        task = TaskProcess(self, role, index, self.argv, env, attempt)
        self.tasks[task.name] = task
        self.history.append(task)
        return task

    def start_all(self, attempt: int) -> None:
        self.start_task("chief", 0, attempt)
        for i in range(self.config.workers):
            self.start_task("tuner", i, attempt)
        self.activity = time.monotonic()


def _prepare_out(config: SearchConfig, *, resume: bool | None) -> None:
    out_dir, project = Path(config.out_dir), Path(config.out_dir) / PROJECT
    check_writable(out_dir / CONFIG_FILE)
    if should_resume(out_dir, resume, saved=(out_dir / CONFIG_FILE).exists() and project.exists()):
        check_saved_search(project)
        different = SearchConfig.load(out_dir).differences(config)
        if different:
            raise ValueError(f"{config.out_dir!r} holds a search with other options: {'; '.join(different)}. Give "
                             "the same options to continue it, resume=False (--fresh) to start over (its trials "
                             "are deleted), or another out_dir (--out).")
        return
    shutil.rmtree(project, ignore_errors=True)
    for name in ("times.json", "results.json", "results.txt", "objective.png", "hyperparameters.png",
                 "best_model.keras"):
        (out_dir / name).unlink(missing_ok=True)


def _tail(task: TaskProcess) -> str:
    lines = [line for line in task.tail if line.strip()][-_TAIL:]
    return "\n".join(f"  {line}" for line in lines) or "  (no output)"


def _supervise(job: _SearchJob, timeout: float | None) -> int:
    """Runs the search to its end; returns how many tuners were restarted."""
    config = job.config
    with forwarded_signals(job) as received:
        supervisor = Supervisor(job, max_restarts=config.max_restarts, backoff=0.5, max_backoff=5.0, timeout=timeout,
                                hang_timeout=None, grace=30.0, received=received)
        outcome = supervisor.run()
    if job.errors:
        raise job.errors[0]
    failure = supervisor.failure
    if outcome.returncode == 0 or failure is None:
        if outcome.returncode:
            raise TuningError(outcome.error or f"The search ended with status {outcome.returncode}.")
        return outcome.restarts
    if failure.code == HUNG_STATUS:
        raise TuningError(f"The search did not finish within {timeout:g} s.")
    task = job.tasks[failure.task]
    if failure.task == "chief:0":
        raise TuningError(f"The chief oracle exited with status {failure.code}. The oracle's state is saved in "
                          f"{config.out_dir!r}: the same search run again continues it.\n{_tail(task)}")
    raise TuningError(f"Tuner worker {task.index} {describe_exit(failure.code)} after {outcome.restarts} restart(s) "
                      f"of tuners (max_restarts={config.max_restarts}); the search stops. The same search run again "
                      f"continues it.\n{_tail(task)}")


@dataclass(frozen=True)
class TrialOptions:
    """How each trial trains and is judged; see :class:`~tensorfleet.tuning.config.SearchConfig`."""

    objective: str = "val_accuracy"
    direction: str | None = None
    strategy: str = "one_device"
    devices_per_trial: int = 1
    batch_size: int = 32
    seed: int = 0
    pin_cores: bool = False


@dataclass(frozen=True)
class Supervision:
    """How the search's processes are supervised.

    ``max_restarts``: restarts of tuner workers allowed in the whole search; ``timeout``: seconds
    after which the search is stopped with :class:`TuningError` (faults to inject, in tests and
    benchmarks: :func:`tensorfleet.testing.faults`, task names ``chief:0`` and ``tuner:I``).
    """

    max_restarts: int = 3
    timeout: float | None = None


@renamed(out="out_dir", fresh=("resume", fresh_to_resume))
def search(script: str | Path, *, out_dir: str | Path = "tune_out", workers: int = 2, max_trials: int = 10,
           algorithm: str = "random", epochs: int = 5, trial: TrialOptions = TrialOptions(),
           supervision: Supervision = Supervision(), resume: bool | None = None,
           log: Callable[[str], None] = print, verbose: bool = False) -> SearchResult:
    """Runs a distributed Keras Tuner search of ``script`` (which defines ``build_model(hp)`` and
    ``data()``) with ``workers`` tuner processes and Keras Tuner's chief oracle.

    Args:
        script: the search script (see :mod:`tensorfleet.tuning.config`).
        out_dir: where the oracle's state, the results and the best model go.
        workers, max_trials, algorithm, epochs: see :class:`~tensorfleet.tuning.config.SearchConfig`.
        trial: the objective and how each trial trains (:class:`TrialOptions`).
        supervision: restarts and time-out (:class:`Supervision`).
        resume: None (default) continues the search saved in ``out_dir`` if there is one and begins one
            otherwise; True continues it (an error when there is none); False deletes it and begins again.
        log: receives the progress lines; ``verbose``: also every line the processes print.

    Returns:
        The :class:`SearchResult`; the table, JSON and plots are in ``out_dir``.

    Raises:
        tensorfleet.tuning.task.TunerKerasError: the script's ``build_model`` returns models of the Keras that
            Keras Tuner does not drive in this search (Keras 3 it is, unless the environment sets
            ``TF_USE_LEGACY_KERAS=1``: then tf_keras); the message names the fix.
        ValueError: bad options, or an error in what the script gives (reported by the processes).
        TuningError: the search could not finish.

    Example:
        >>> result = search("examples/tune_digits.py", workers=2, max_trials=4,
        ...                 trial=TrialOptions(batch_size=64), supervision=Supervision(timeout=600))  # doctest: +SKIP
    """
    check_script(script)
    config = SearchConfig(script=str(script), out_dir=str(out_dir), workers=workers, max_trials=max_trials,
                          objective=trial.objective, **enum_options(trial.direction, algorithm),
                          strategy=trial.strategy, devices_per_trial=trial.devices_per_trial, epochs=epochs,
                          batch_size=trial.batch_size, seed=trial.seed, max_restarts=supervision.max_restarts,
                          pin_cores=trial.pin_cores)
    _prepare_out(config, resume=resume)
    config.save()
    job = _SearchJob(config, log=log, verbose=verbose)
    from tensorfleet.compat.keras_tuner import search_keras

    driven = "Keras 3" if search_keras().value == "keras3" else "tf_keras (TF_USE_LEGACY_KERAS=1)"
    log(f"[tune] {config.algorithm.value} search of {Path(config.script).name}: {config.workers} tuner worker(s), "
        f"{config.max_trials} trials, objective {config.objective}, oracle on {HOST}:{job.port}, models in {driven}")
    try:
        restarts = _supervise(job, supervision.timeout)
    finally:
        job.stop_all(signal.SIGKILL, 0.0)
    summary, records = read_results(config.out_dir)
    best = best_record(records, summary["direction"])
    model = Path(config.out_dir) / summary["best"]["model"] if summary["best"] and summary["best"]["model"] else None
    return SearchResult(Path(config.out_dir), summary["objective"], summary["direction"], records, best, model,
                        job.now(), restarts)


def describe(result: SearchResult) -> str:
    """Two lines on a finished search, for the command line."""
    best = result.best
    head = f"{result.completed} of {len(result.trials)} trials completed in {result.seconds:.1f} s"
    if best is None:
        return f"{head}; no trial completed, so no best model."
    values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in best.hyperparameters.items() if not k.startswith("tuner/"))
    model = f" -> {result.best_model}" if result.best_model else ""
    return f"{head}\nbest: trial {best.trial_id}, {result.objective}={best.score:.4f} ({values}){model}"
