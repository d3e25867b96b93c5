"""``tensorfleet federated``: run a simulation, plot a run, list algorithms and aggregators.

Runs need no tensorflow-federated (the compiled backend); ``--backend tff``, ``--workers``, the
``worker`` command and TFF's own dataset (``emnist-synthetic``) need the tff track, and say so in one
line (exit status 2) where TFF cannot be imported.

Example:
    tensorfleet federated run --dataset digits --clients 100 --partition dirichlet:0.3 \\
        --algorithm fedavg --rounds 20 --out runs/a | tail -1
    tensorfleet federated plot runs/a
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from enum import Enum
from typing import Any, Iterator, Optional

import typer

from tensorfleet.federated.backends import Backend
from tensorfleet.federated.backends.compiled_layout import NonTrainable
from tensorfleet.federated.sampling import StragglerPolicy

__all__ = ["NAME", "app"]

NAME = "federated"
app = typer.Typer(help="Federated learning simulations (compiled, or on tensorflow-federated on the tff track).",
                  no_args_is_help=True)


class TFThreads(str, Enum):
    LANES = "lanes"
    TENSORFLOW = "tensorflow"


@app.command("run")
def run(
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file with the same keys as the flags."),
    model: Optional[str] = typer.Option(None, "--model", help="A zoo model name (default digits_mlp) or a saved Keras model file (.keras, .h5: either Keras; the run starts from its weights)."),
    dataset: Optional[str] = typer.Option(None, "--dataset",
                                          help="digits | emnist-synthetic (TFF's own 2 clients; tff track)."),
    clients: Optional[int] = typer.Option(None, "--clients",
                                          help="Clients to split digits into (default 100); of a TFF dataset, the first N."),
    partition: Optional[str] = typer.Option(None, "--partition",
                                            help="iid (default) | dirichlet:ALPHA | shards:K | quantity:BETA (digits)."),
    algorithm: Optional[str] = typer.Option(None, "--algorithm", help="See 'tensorfleet federated algorithms'."),
    rounds: Optional[int] = typer.Option(None, "--rounds"),
    clients_per_round: Optional[int] = typer.Option(None, "--clients-per-round", help="Default 10 (or all, when fewer)."),
    dropout: Optional[float] = typer.Option(None, "--dropout", help="Per-round client dropout rate."),
    straggler_deadline: Optional[float] = typer.Option(None, "--straggler-deadline", help="Simulated seconds."),
    straggler_share: Optional[float] = typer.Option(
        None, "--straggler-share", help="Share of each round's clients that run a random number of local epochs in "
                                        "[1, --local-epochs] (the FedProx paper's systems heterogeneity)."),
    straggler_policy: Optional[StragglerPolicy] = typer.Option(
        None, "--straggler-policy", case_sensitive=False,
        help="drop (default: stragglers are left out) | partial (their partial work counts, weighted by examples)."),
    non_trainable: Optional[NonTrainable] = typer.Option(
        None, "--non-trainable", case_sensitive=False,
        help="mean (default: BatchNormalization statistics averaged by examples) | initial (kept, as TFF "
             "does) | per_client (FedBN: each client keeps its own BatchNormalization layers)."),
    dp: Optional[str] = typer.Option(None, "--dp", help="'noise_multiplier=1.0,clip=0.5' or 'adaptive:noise_multiplier=0.5'."),
    aggregator: Optional[str] = typer.Option(None, "--aggregator", help="NAME[:key=value,...], e.g. trimmed_mean:beta=0.2."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for metrics, plots, checkpoints."),
    seed: Optional[int] = typer.Option(None, "--seed"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size"),
    local_epochs: Optional[int] = typer.Option(None, "--local-epochs"),
    client_lr: Optional[float] = typer.Option(None, "--client-lr"),
    server_lr: Optional[float] = typer.Option(None, "--server-lr"),
    eval_every: Optional[int] = typer.Option(None, "--eval-every"),
    eval_clients: Optional[int] = typer.Option(None, "--eval-clients", help="Clients held out for federated eval."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every"),
    no_progress: bool = typer.Option(False, "--no-progress", help="Hide the progress bar."),
    resume: Optional[bool] = typer.Option(None, "--resume/--fresh",
                                          help="Continue from the checkpoint in --out (default), or start over and "
                                               "overwrite it."),
    workers: Optional[str] = typer.Option(None, "--workers", help="HOST:PORT,HOST:PORT of TFF workers to split rounds across."),
    backend: Optional[Backend] = typer.Option(None, "--backend", case_sensitive=False,
                                              help="auto (default: compiled where it equals tff, else tff) | tff (tff track) | "
                                               "compiled (one TensorFlow function per round; faster; no TFF needed)."),
    tf_threads: Optional[TFThreads] = typer.Option(
        None, "--tf-threads", case_sensitive=False,
        help="lanes (the default where TensorFlow has not started yet, as in a new process: one intra-op thread "
             "and an inter-op thread per compiled lane plus one; 1.2-1.9x faster rounds on small models) | "
             "tensorflow (TensorFlow's own pools)."),
) -> None:
    """Runs one simulation; prints one JSON line with the final metrics last."""
    from tensorfleet.federated.experiment import load_config, resolve_config

    cfg = load_config(config) if config is not None else {}
    flags = dict(model=model, dataset=dataset, clients=clients, partition=partition, algorithm=algorithm,
                 rounds=rounds, clients_per_round=clients_per_round, dropout=dropout,
                 straggler_deadline=straggler_deadline, dp=dp, aggregator=aggregator,
                 out=None if out is None else str(out), seed=seed, batch_size=batch_size, local_epochs=local_epochs,
                 client_lr=client_lr, server_lr=server_lr, eval_every=eval_every, eval_clients=eval_clients,
                 checkpoint_every=checkpoint_every, backend=None if backend is None else backend.value, resume=resume,
                 straggler_share=straggler_share, non_trainable=None if non_trainable is None else non_trainable.value,
                 straggler_policy=None if straggler_policy is None else straggler_policy.value)
    cfg.update({k: v for k, v in flags.items() if v is not None})
    if no_progress:
        cfg["progress"] = False
    cfg = resolve_config(cfg)
    if tf_threads is not TFThreads.TENSORFLOW and not workers and cfg.get("backend") != "tff":
        _lane_threads(cfg["clients_per_round"] or 10, strict=tf_threads is TFThreads.LANES)
    with _tff_needed():
        history = _run_or_explain(cfg, workers)
    last = history.rounds[-1] if history.rounds else {}
    summary = {"algorithm": cfg["algorithm"].partition(":")[0], "backend": history.config.get("backend"), "rounds": last.get("round", 0)}
    for key in ("train_accuracy", "test_accuracy", "fed_eval_accuracy", "epsilon"):
        if key in last:
            summary[key] = round(float(last[key]), 4)
    if cfg["out"]:
        summary["out"] = cfg["out"]
    typer.echo(json.dumps(summary))


@app.command("plot")
def plot(out: Path = typer.Argument(..., help="The --out directory of a run.")) -> None:
    """Re-draws accuracy.png and loss.png from a run's metrics.json."""
    from tensorfleet.federated.history import load_history, plot_history

    for path in plot_history(load_history(out), out):
        typer.echo(str(path))


@app.command("algorithms")
def algorithms() -> None:
    """Every registered algorithm with its default optimizers and paper."""
    from tensorfleet.federated.algorithms import catalogue

    for row in catalogue():
        opts = ", ".join(f"{k}={v}" for k, v in row["options"].items())
        typer.echo(f"{row['name']:<11} client={row['client_optimizer'] or '-':<14} server={row['server_optimizer']:<16} "
                   f"{opts + '  ' if opts else ''}{row['description']} [{row['paper']}]")


@app.command("aggregators")
def aggregators() -> None:
    """Every registered aggregator with its options and the backends that run it."""
    from tensorfleet.federated.aggregators import catalogue

    for row in catalogue():
        opts = ",".join(row["options"]) or "-"
        typer.echo(f"{row['name']:<13} options={opts:<48} [{','.join(row['backends'])}] {row['description']}")


@app.command("partition")
def partition_cmd(
    dataset: str = typer.Option("digits", "--dataset", help="digits | emnist-synthetic (TFF's own 2 clients)."),
    clients: Optional[int] = typer.Option(None, "--clients", help="Default 100 for digits; all of a TFF dataset's."),
    partition: Optional[str] = typer.Option(None, "--partition", help="Default iid (digits only)."),
    seed: int = typer.Option(0, "--seed"),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for partition.json and partition.png."),
) -> None:
    """Summarizes a partition; with --out also writes its JSON summary and label-distribution PNG."""
    from tensorfleet.federated.clients.clientdata import summarize
    from tensorfleet.federated.clients.datasets import load_federated

    with _tff_needed():
        data, _ = load_federated(dataset, num_clients=clients, scheme=partition, seed=seed)
    summary = summarize(data)
    typer.echo(str(summary))
    if out is not None:
        typer.echo(str(summary.save(out / "partition.json")))
        typer.echo(str(summary.plot(out / "partition.png")))


@contextlib.contextmanager
def _tff_needed() -> Iterator[None]:
    """What needs tensorflow-federated where it cannot be imported: one ``error:`` line, exit status 2."""
    from tensorfleet.compat.tff import TffUnavailableError

    try:
        yield
    except TffUnavailableError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


def _lane_threads(clients_per_round: int, strict: bool) -> None:
    """TensorFlow's pools for the compiled backend's lanes; asked for by name, a runtime already started
    with other pools is an error, else TensorFlow keeps its own (the run's metrics record which)."""
    from tensorfleet.federated.backends.threads import configure_threads

    try:
        configure_threads(clients_per_round, strict=strict)
    except RuntimeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tf-threads") from exc


def _run_or_explain(cfg: dict, workers: Optional[str]) -> Any:
    """The run's history; a checkpoint in --out that cannot be continued is explained in the CLI's words."""
    from tensorfleet.federated.checkpoint import CheckpointAheadError, CheckpointMismatchError, DamagedCheckpointError
    from tensorfleet.federated.experiment import run_experiment

    try:
        return run_experiment(cfg) if not workers else _run_on_workers(cfg, workers)
    except DamagedCheckpointError as err:
        typer.echo(f"error: {err.reason} Run with --fresh to start over (it overwrites the checkpoint), or use "
                   f"another --out.", err=True)
        raise typer.Exit(2) from None
    except CheckpointMismatchError as err:
        more = f"Run with --rounds {err.checkpoint_round} or more to continue it, or use another --out, " \
            if isinstance(err, CheckpointAheadError) else "Use another --out, "
        typer.echo(f"error: {err.reason} {more}or --fresh to start over (it overwrites the checkpoint).", err=True)
        raise typer.Exit(2) from None


def _run_on_workers(cfg: dict, workers: str) -> object:
    """The experiment of ``cfg`` with each round's clients split across ``workers``."""
    from tensorfleet.federated.backends.addresses import AllWorkersLostError, WorkerError
    from tensorfleet.federated.experiment import build_simulation

    sim = build_simulation(cfg, workers=workers)
    try:
        return sim.run()
    except (WorkerError, AllWorkersLostError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


@app.command("worker")
def worker(
    port: int = typer.Option(..., "--port", help="TCP port to serve on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the worker is reached at."),
    max_concurrent: int = typer.Option(-1, "--max-concurrent", help="Parallel calls per computation (<= 0: no limit)."),
    log: Optional[Path] = typer.Option(None, "--log", help="File for the worker's output (default: discarded)."),
) -> None:
    """Serves one TFF C++ worker (TFF's worker_binary) until SIGTERM or Ctrl-C, then stops it."""
    import sys

    from tensorfleet.federated.backends.worker import WorkerPortInUseError, serve

    def ready(w: object) -> None:
        typer.echo(f"TFF worker serving on {w.address} (pid {w.pid}); SIGTERM or Ctrl-C stops it")  # type: ignore[attr-defined]
        sys.stdout.flush()

    with _tff_needed():  # outside the next block: typer.Exit is a RuntimeError
        try:
            status = serve(port, host=host, max_concurrent=max_concurrent, log_path=log, on_ready=ready)
        except (WorkerPortInUseError, RuntimeError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None
    if status:
        typer.echo(f"error: the TFF worker on {host}:{port} exited with status {status}", err=True)
    raise typer.Exit(1 if status else 0)


def _register_tune() -> None:
    """``tensorfleet federated tune``: Keras Tuner's oracle over federated simulations (tensorfleet.cli.tune)."""
    from tensorfleet.cli.tune import federated_tune_command

    app.command("tune")(federated_tune_command)


_register_tune()
