"""The chief of a distributed search: Keras Tuner's oracle served over gRPC, its progress, and
the results once every trial has ended.

The server is Keras Tuner's own (its ``OracleServicer``, the protocol its workers speak, reached
through :mod:`tensorfleet.compat.keras_tuner`); this module runs it in a loop that notices the end within a
fraction of a second (Keras Tuner's own loop checks every 20 s once one worker is done), times
each trial (the oracle keeps no times) and prints one progress line per trial begun or ended.

The oracle saves its state in ``OUT/oracle`` after every change; a chief started again over the
same directory reloads it and runs the trials that were running again (``--resume``).
"""

from __future__ import annotations

import json
import os
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Callable

from tensorfleet.cluster.evaluation import export_model
from tensorfleet.io import write_json
from tensorfleet.tuning.config import SearchConfig
from tensorfleet.tuning.results import TrialRecord, write_results
from tensorfleet.tuning.task import make_tuner, say

__all__ = ["TrialClock", "atomic_saves", "export_model", "repair_reloaded", "serve", "run_chief", "BEST_MODEL",
           "TIMES_FILE"]

BEST_MODEL = "best_model.keras"
TIMES_FILE = "times.json"
POLL_SECONDS = 0.2


class TrialClock:
    """When each trial began and ended and how often it ran, kept in ``OUT/times.json``; prints
    the progress of the search (trials done, running, the best) as trials begin and end."""

    def __init__(self, oracle: Any, path: Path, *, emit: Callable[[str], None] = say) -> None:
        self.oracle, self.path, self.emit = oracle, path, emit
        self.times: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}

    def attach(self) -> None:
        """Wraps the oracle's ``create_trial`` and ``end_trial`` (what the gRPC servicer calls)."""
        create, end = self.oracle.create_trial, self.oracle.end_trial

        def create_trial(tuner_id: str) -> Any:
            again = tuner_id in self.oracle.ongoing_trials
            trial = create(tuner_id)
            if trial.status == "RUNNING":
                self.began(trial.trial_id, tuner_id, again)
            return trial

        def end_trial(trial: Any) -> None:
            end(trial)
            # Keras Tuner saves its state before it lets go of the ended trial; saved again here, a
            # resume does not take a trial that ended for one that was running and run it again.
            self.oracle.save()
            self.ended(trial.trial_id)

        self.oracle.create_trial, self.oracle.end_trial = create_trial, end_trial

    def began(self, trial_id: str, tuner_id: str, again: bool) -> None:
        entry = self.times.setdefault(trial_id, {"runs": 0})
        entry.update(start=time.time(), end=None, tuner=tuner_id, runs=entry["runs"] + 1)
        write_json(self.path, self.times)
        values = ", ".join(f"{k}={_short(v)}" for k, v in self.oracle.trials[trial_id].hyperparameters.values.items()
                           if not k.startswith("tuner/"))
        how = "runs again (its worker was restarted)" if again or entry["runs"] > 1 else "began"
        self.emit(f"trial {trial_id} {how} on {tuner_id}: {values} | {self.progress()}")

    def ended(self, trial_id: str) -> None:
        entry = self.times.setdefault(trial_id, {"runs": 1, "start": None})
        entry["end"] = time.time()
        write_json(self.path, self.times)
        trial = self.oracle.trials[trial_id]
        seconds = entry["end"] - entry["start"] if entry.get("start") else float("nan")
        score = f"{self.oracle.objective.name}={trial.score:.4f}" if trial.score is not None else "no score"
        self.emit(f"trial {trial_id} {str(trial.status).lower()} in {seconds:.1f}s: {score} | {self.progress()}")

    def progress(self) -> str:
        done, running = len(self.oracle.end_order), len(self.oracle.ongoing_trials)
        best = [t for t in self.oracle.get_best_trials(1) if t.status == "COMPLETED" and t.score is not None]
        best_text = f"best {best[0].score:.4f} (trial {best[0].trial_id})" if best else "no best yet"
        total = self.oracle.max_trials or "?"
        return f"{done}/{total} done, {running} running, {best_text}"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def serve(oracle: Any, host: str, port: int, *, poll: float = POLL_SECONDS) -> None:
    """Serves ``oracle`` on ``host:port`` with Keras Tuner's servicer until the search has ended:
    a worker was told to stop and no trial runs and no worker is left."""
    import grpc

    from tensorfleet.compat.keras_tuner import add_oracle_servicer, exit_chief, servicer_stopped

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    servicer = add_oracle_servicer(oracle, server)
    if not server.add_insecure_port(f"{host}:{port}"):
        raise RuntimeError(f"The oracle cannot listen on {host}:{port} (the port is taken?).")
    server.start()
    say(f"oracle listening on {host}:{port}")
    try:
        while not (servicer_stopped(servicer) and exit_chief(oracle)):
            time.sleep(poll)
    finally:
        server.stop(grace=2.0)


def run_chief(config: SearchConfig, build_model: Callable[..., Any]) -> None:
    """Serves the search until it ends, then writes the results and exports the best model."""
    tuner = make_tuner(config, build_model)
    repair_reloaded(tuner.oracle)
    atomic_saves(tuner.oracle)
    tuner.oracle.verbose = 0  # the progress lines below say what Keras Tuner's tables would
    clock = TrialClock(tuner.oracle, Path(config.out_dir) / TIMES_FILE)
    clock.attach()
    tuner.save()
    serve(tuner.oracle, os.environ["KERASTUNER_ORACLE_IP"], int(os.environ["KERASTUNER_ORACLE_PORT"]))
    space = [hp.name for hp in tuner.oracle.hyperparameters.space]  # the table's columns in build_model's order
    records = [TrialRecord.from_trial(trial, clock.times.get(trial_id, {}), order=space)
               for trial_id, trial in sorted(tuner.oracle.trials.items())]
    best = [t for t in tuner.oracle.get_best_trials(1) if t.status == "COMPLETED"]
    if best:
        export_model(tuner.load_model(best[0]), Path(config.out_dir) / BEST_MODEL)
    write_results(Path(config.out_dir), records, objective=tuner.oracle.objective.name,
                  direction=tuner.oracle.objective.direction, best_model=BEST_MODEL if best else None)
    say(f"search ended: {sum(r.status == 'COMPLETED' for r in records)} of {len(records)} trials completed")


def atomic_saves(oracle: Any) -> None:
    """Makes the oracle write its state and its trials' files atomically. Keras Tuner writes them in
    place, so a chief killed while writing would leave half a file for ``--resume`` to fail on."""
    from tensorfleet.compat.keras_tuner import oracle_state_file, replace_trial_saver, trial_file

    oracle.save = lambda: write_json(oracle_state_file(oracle), oracle.get_state())
    replace_trial_saver(oracle, lambda trial: write_json(trial_file(oracle, trial.trial_id), trial.get_state()))


def repair_reloaded(oracle: Any) -> None:
    """Makes a reloaded oracle's retry queue agree with its trials' own files.

    Keras Tuner writes an ended trial's file before its own state, and its reload sends every
    trial its state lists as running to be run again. A chief killed between the two writes would
    run a finished trial again; one whose trial file is still ``RUNNING`` while the state no longer
    lists it would never run it. Trials that ended leave the queue; running ones not in it join it.
    """
    from tensorfleet.compat.keras_tuner import retry_queue, set_retry_queue

    queue = [tid for tid in retry_queue(oracle) if oracle.trials[tid].status not in ("COMPLETED", "FAILED")]
    queue += [tid for tid, trial in sorted(oracle.trials.items()) if trial.status == "RUNNING" and tid not in queue]
    set_retry_queue(oracle, queue)


