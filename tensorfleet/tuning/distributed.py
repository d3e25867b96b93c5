"""A distributed Keras Tuner search on this machine: the chief oracle and N tuner workers as
processes on 127.0.0.1, supervised.

Keras Tuner's own distributed mode does the search: each process is started with
``KERASTUNER_TUNER_ID``, ``KERASTUNER_ORACLE_IP`` and ``KERASTUNER_ORACLE_PORT`` (a free port
from portpicker) and runs :mod:`tensorfleet.tuning.task`. The processes are
:class:`tensorfleet.cluster.processes.TaskProcess` es: each leads its own process group and dies
with this one.

Faults: a worker that dies is started again with the same tuner ID, and Keras Tuner's oracle
gives a tuner that asks again under its ID the trial it was running, so that trial runs again
and the search completes (up to ``max_restarts`` times per worker). A chief that dies ends the
search with an error; ``resume=True`` starts a new chief over the saved oracle, which runs the
trials that were running again and the ones not yet begun.

Example:
    >>> result = search("examples/tune_digits.py", workers=2, max_trials=4)  # doctest: +SKIP
    >>> result.best.score, result.best.hyperparameters                      # doctest: +SKIP
    (0.9722, {'units': 64, 'learning_rate': 0.01})
"""

from __future__ import annotations

import re
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tensorfleet.cluster.processes import Fault, TaskProcess
from tensorfleet.io import check_writable
from tensorfleet.tuning.config import CONFIG_FILE, SearchConfig, check_script
from tensorfleet.tuning.results import TrialRecord, best_record, read_results
from tensorfleet.tuning.task import ERROR_MARK, KERAS3_MARK, MARK, PROJECT

__all__ = ["SearchResult", "TuningError", "describe", "search"]

HOST = "127.0.0.1"
_TAIL = 15


class TuningError(RuntimeError):
    """The search could not finish (a chief that died, a worker that kept dying, a time-out)."""


@dataclass(frozen=True)
class SearchResult:
    """What a finished search left in ``out``: its records, the best and the time it took."""

    out: Path
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


class _Job:
    """The processes of one search and their output (the interface TaskProcess reports to)."""

    def __init__(self, config: SearchConfig, *, log: Callable[[str], None], verbose: bool,
                 faults: Sequence[Fault]) -> None:
        import portpicker

        self.config, self.log, self.verbose = config, log, verbose
        self.quiet, self.progress_interval = not verbose, 5.0
        self.port = portpicker.pick_unused_port()
        self.faults, self.fired = list(faults), set()
        self.start = time.monotonic()
        self.tasks: dict[str, TaskProcess] = {}
        self.errors: list[Exception] = []  # what a process reported as the user's error, first first
        self.lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.start

    def on_progress(self, task: TaskProcess, text: str) -> None:
        if self.verbose:
            self.log(f"[{task.name}] {text}")

    def on_line(self, task: TaskProcess, text: str) -> None:
        if text.startswith((ERROR_MARK, KERAS3_MARK)):
            from tensorfleet.compat.keras import Keras3ModelError

            kind, mark = (Keras3ModelError, KERAS3_MARK) if text.startswith(KERAS3_MARK) else (ValueError, ERROR_MARK)
            with self.lock:
                self.errors.append(kind(text[len(mark):].strip()))
        elif text.startswith(MARK):
            self.log(f"[{task.name}] {text[len(MARK):].strip()}")
        elif self.verbose:
            self.log(f"[{task.name}] {text}")
        for i, fault in enumerate(self.faults):
            if (i not in self.fired and (fault.watch or fault.task) == task.name and fault.attempt == task.attempt
                    and re.search(fault.when, text)):
                self.fired.add(i)
                threading.Timer(fault.delay, self._inject, (fault,)).start()

    def _inject(self, fault: Fault) -> None:
        target = self.tasks.get(fault.task)
        if target is not None and target.poll() is None:
            self.log(f"[tune] injecting fault: {signal.Signals(fault.signal).name} to {fault.task}")
            target.kill(fault.signal)

    def start_task(self, role: str, index: int, attempt: int) -> TaskProcess:
        import os

        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env.update(KERASTUNER_TUNER_ID="chief" if role == "chief" else f"tuner{index}",
                   KERASTUNER_ORACLE_IP=HOST, KERASTUNER_ORACLE_PORT=str(self.port), PYTHONUNBUFFERED="1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        argv = [sys.executable, "-m", "tensorfleet.tuning.task", self.config.out]
        task = TaskProcess(self, role, index, argv, env, attempt)  # type: ignore[arg-type]
        self.tasks[task.name] = task
        return task

    def stop(self, grace: float = 5.0) -> None:
        for task in self.tasks.values():
            if task.poll() is None:
                task.kill(signal.SIGTERM)
        for task in self.tasks.values():
            task.reap(grace)


def _prepare_out(config: SearchConfig, *, resume: bool, fresh: bool) -> None:
    out, project = Path(config.out), Path(config.out) / PROJECT
    check_writable(out / CONFIG_FILE)
    if resume and fresh:
        raise ValueError("resume and fresh exclude each other: give one of --resume and --fresh.")
    if resume:
        if not (out / CONFIG_FILE).exists() or not project.exists():
            raise ValueError(f"Nothing to resume in {config.out!r}: it holds no search. Leave out --resume to begin one.")
        different = SearchConfig.load(out).differences(config)
        if different:
            raise ValueError(f"--resume continues the search in {config.out!r} with its options, but these differ: "
                             f"{'; '.join(different)}. Give the same options, or --fresh to start over.")
        return
    if project.exists():
        if not fresh:
            raise ValueError(f"{config.out!r} already holds a search. Pass --resume to continue it, --fresh to "
                             "start over (its trials are deleted), or choose another --out.")
        shutil.rmtree(project)
    for name in ("times.json", "results.json", "results.txt", "objective.png", "hyperparameters.png",
                 "best_model.keras"):
        (out / name).unlink(missing_ok=True)


def _tail(task: TaskProcess) -> str:
    lines = [line for line in task.tail if line.strip()][-_TAIL:]
    return "\n".join(f"  {line}" for line in lines) or "  (no output)"


def _supervise(job: _Job, timeout: float | None) -> int:
    """Runs the search to its end; returns how many workers were restarted."""
    config, restarts = job.config, 0
    deadline = None if timeout is None else time.monotonic() + timeout
    job.start_task("chief", 0, 0)
    workers = {i: job.start_task("tuner", i, 0) for i in range(config.workers)}
    while True:
        time.sleep(0.1)
        if job.errors:
            raise job.errors[0]
        chief = job.tasks["chief:0"]
        code = chief.poll()
        if code == 0:  # every worker was told to stop; one still asking ends within the grace
            for worker in workers.values():
                worker.reap(30.0)
            return restarts
        if code is not None and code != 0:
            chief.reap(1.0)  # its output is read to the end first: an error line may close it
            if job.errors:
                raise job.errors[0]
            raise TuningError(f"The chief oracle exited with status {code}. The oracle's state is saved in "
                              f"{config.out!r}: run the same command with --resume to continue.\n{_tail(chief)}")
        for i, worker in list(workers.items()):
            status = worker.poll()
            if status in (None, 0) or code == 0:
                continue
            worker.reap(1.0)
            if job.errors:
                raise job.errors[0]
            if worker.attempt >= config.max_restarts:
                raise TuningError(f"Tuner worker {i} died {worker.attempt + 1} times (last status {status}); "
                                  f"the search stops. Resume it with --resume.\n{_tail(worker)}")
            job.log(f"[tune] tuner{i} exited with status {status}; starting it again (its trial runs again)")
            workers[i] = job.start_task("tuner", i, worker.attempt + 1)
            restarts += 1
        if deadline is not None and time.monotonic() > deadline:
            raise TuningError(f"The search did not finish within {timeout:g} s.")


def search(script: str | Path, *, out: str | Path = "tune_out", workers: int = 2, max_trials: int = 10,
           objective: str = "val_accuracy", direction: str | None = None, algorithm: str = "random",
           strategy: str = "one_device", devices_per_trial: int = 1, epochs: int = 5, batch_size: int = 32,
           seed: int = 0, max_restarts: int = 3, pin_cores: bool = False, resume: bool = False, fresh: bool = False,
           timeout: float | None = None, log: Callable[[str], None] = print, verbose: bool = False,
           faults: Sequence[Fault] = ()) -> SearchResult:
    """Runs a distributed Keras Tuner search of ``script`` (which defines ``build_model(hp)`` and
    ``data()``) with ``workers`` tuner processes and Keras Tuner's chief oracle.

    Args:
        script: the search script (see :mod:`tensorfleet.tuning.config`).
        out: where the oracle's state, the results and the best model go.
        workers, max_trials, objective, direction, algorithm, strategy, devices_per_trial, epochs,
            batch_size, seed, max_restarts, pin_cores: see :class:`~tensorfleet.tuning.config.SearchConfig`.
        resume: continue the search saved in ``out``; ``fresh``: delete it and begin again.
        timeout: seconds after which the search is stopped with :class:`TuningError`.
        log: receives the progress lines; ``verbose``: also every line the processes print.
        faults: faults to inject (for tests and benchmarks), with task names ``chief:0`` and ``tuner:I``.

    Returns:
        The :class:`SearchResult`; the table, JSON and plots are in ``out``.

    Raises:
        tensorfleet.compat.keras.Keras3ModelError: the script's ``build_model`` returns a Keras 3 model.
        ValueError: bad options, or an error in what the script gives (reported by the processes).
        TuningError: the search could not finish.
    """
    check_script(script)
    config = SearchConfig(script=str(script), out=str(out), workers=workers, max_trials=max_trials,
                          objective=objective, direction=direction, algorithm=algorithm, strategy=strategy,
                          devices_per_trial=devices_per_trial, epochs=epochs, batch_size=batch_size, seed=seed,
                          max_restarts=max_restarts, pin_cores=pin_cores)
    _prepare_out(config, resume=resume, fresh=fresh)
    config.save()
    job = _Job(config, log=log, verbose=verbose, faults=faults)
    log(f"[tune] {config.algorithm.value} search of {Path(config.script).name}: {config.workers} tuner worker(s), "
        f"{config.max_trials} trials, objective {config.objective}, oracle on {HOST}:{job.port}")
    try:
        restarts = _supervise(job, timeout)
    finally:
        job.stop()
    summary, records = read_results(config.out)
    best = best_record(records, summary["direction"])
    model = Path(config.out) / summary["best"]["model"] if summary["best"] and summary["best"]["model"] else None
    return SearchResult(Path(config.out), summary["objective"], summary["direction"], records, best, model,
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
