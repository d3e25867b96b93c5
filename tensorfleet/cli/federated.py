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
import inspect
import json
import math
import os
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Optional

import typer

from tensorfleet.federated.backends.addresses import WorkerRuntime

__all__ = ["NAME", "app"]

NAME = "federated"
app = typer.Typer(help="Federated learning simulations (compiled, or on tensorflow-federated on the tff track).",
                  no_args_is_help=True)


class TFThreads(str, Enum):
    LANES = "lanes"
    TENSORFLOW = "tensorflow"


def _run_parameters() -> list[inspect.Parameter]:
    """The flags of ``run``: ``--config``, one per experiment key (:data:`~tensorfleet.federated.experiment.OPTIONS`,
    the declaration: name, type, help; the default stays the config's or the declaration's), the older names
    of renamed keys (hidden), and ``--tf-threads``."""
    from tensorfleet.federated.experiment import DEFAULTS, OPTIONS

    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("config", keyword, annotation=Optional[Path], default=typer.Option(
        None, "--config", help="YAML file with the same keys as the flags (the flags override it)."))]
    for name, info in OPTIONS.items():
        kind = info.cli_type or _plain(info.annotation)
        default = DEFAULTS[name]
        shown = "" if default is None or kind is bool else f" [default: {getattr(default, 'value', default)}]"
        decls = [info.flag] + (["--out-dir"] if info.flag == "--out" else [])
        enum = isinstance(kind, type) and issubclass(kind, Enum)
        choices: dict[str, Any] = {"case_sensitive": False} if enum else {}
        params.append(inspect.Parameter(name, keyword, annotation=Optional[kind], default=typer.Option(
            None, *decls, help=info.help + shown, show_default=False, **choices)))
        for alias in info.aliases:
            if "--" + alias.replace("_", "-") in decls:
                continue  # the flag kept its name (--out): only the YAML key changed
            params.append(inspect.Parameter(alias, keyword, annotation=Optional[kind], default=typer.Option(
                None, "--" + alias.replace("_", "-"), hidden=True)))
    params.append(inspect.Parameter("tf_threads", keyword, annotation=Optional[TFThreads], default=typer.Option(
        None, "--tf-threads", case_sensitive=False,
        help="lanes (the default where TensorFlow has not started yet, as in a new process: one intra-op thread "
             "and an inter-op thread per compiled lane plus one; 1.2-1.9x faster rounds on small models) | "
             "tensorflow (TensorFlow's own pools).")))
    return params


def _plain(annotation: Any) -> Any:
    """The command line's type of a field annotated ``X``, ``Optional[X]`` or ``X | None``."""
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def run(**flags: Any) -> None:
    """Runs one simulation; prints one JSON line with the final metrics last."""
    import warnings

    from tensorfleet.federated.experiment import OPTIONS, load_config, resolve_config

    config, tf_threads = flags.pop("config"), flags.pop("tf_threads")
    cfg = load_config(config) if config is not None else {}
    for info in OPTIONS.values():
        for alias in info.aliases:
            if alias not in flags:
                continue
            if flags.get(alias) is not None:
                # Shown as a `warning:` line by the CLI's entry point (cli.main.warnings_shown).
                warnings.warn(f"--{alias.replace('_', '-')} is now {info.flag.split('/')[0]}; the older flag will stop "
                              "working in the next release.", DeprecationWarning, stacklevel=1)
                flags[info.name] = flags[info.name] if flags[info.name] is not None else flags[alias]
            flags.pop(alias, None)
    cfg.update({k: v for k, v in flags.items() if v is not None})
    cfg = resolve_config(cfg)
    if tf_threads is not TFThreads.TENSORFLOW and not cfg["workers"] and cfg.get("backend") != "tff":
        _lane_threads(cfg["clients_per_round"] or 10, strict=tf_threads is TFThreads.LANES)
    with _tff_needed():
        history = _run_or_explain(cfg)
    last = history.rounds[-1] if history.rounds else {}
    summary = {"algorithm": history.config.get("algorithm"), "backend": history.config.get("backend"),
               "rounds": last.get("round", 0)}
    for key in ("train_accuracy", "test_accuracy", "fed_eval_accuracy", "epsilon"):
        if key in last:
            value = float(last[key])
            # JSON has no infinity: an unbounded epsilon (no noise) is written null, so that every JSON reader
            # parses the line.
            summary[key] = round(value, 4) if math.isfinite(value) else None
    if cfg["out_dir"]:
        summary["out_dir"] = cfg["out_dir"]
    typer.echo(json.dumps(summary))


run.__signature__ = inspect.Signature(_run_parameters())  # type: ignore[attr-defined]
app.command("run")(run)


@app.command("plot")
def plot(out_dir: Path = typer.Argument(..., metavar="OUT", help="The --out directory of a run.")) -> None:
    """Re-draws accuracy.png and loss.png from a run's metrics.json."""
    from tensorfleet.federated.history import HISTORY_FILE, load_history, plot_history
    from tensorfleet.io import existing_folder

    existing_folder(out_dir, f"the --out folder of a run (with its {HISTORY_FILE})")
    for path in plot_history(load_history(out_dir), out_dir):
        typer.echo(str(path))


@app.command("algorithms")
def algorithms() -> None:
    """Every registered algorithm with its default optimizers and paper."""
    from tensorfleet.federated.algorithms import catalogue

    for row in catalogue():
        opts = ", ".join(f"{k}={v}" for k, v in row["options"].items())
        typer.echo(f"{row['name']:<11} client={row['client_optimizer'] or '-':<14} "
                   f"server={row['server_optimizer']:<16} {opts + '  ' if opts else ''}{row['description']} "
                   f"[{row['paper']}]")


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
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Directory for partition.json and partition.png."),
) -> None:
    """Summarizes a partition; with --out also writes its JSON summary and label-distribution PNG."""
    from tensorfleet.federated.clients.clientdata import summarize
    from tensorfleet.federated.clients.datasets import load_federated

    with _tff_needed():
        data, _ = load_federated(dataset, num_clients=clients, scheme=partition, seed=seed)
    summary = summarize(data)
    typer.echo(str(summary))
    if out_dir is not None:
        typer.echo(str(summary.save(out_dir / "partition.json")))
        typer.echo(str(summary.plot(out_dir / "partition.png")))


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


def _run_or_explain(cfg: dict) -> Any:
    """The run's history; a checkpoint in --out that cannot be continued is explained in the CLI's words."""
    from tensorfleet.federated.checkpoint import CheckpointAheadError, CheckpointMismatchError, DamagedCheckpointError
    from tensorfleet.federated.experiment import run_experiment

    try:
        return run_experiment(cfg) if not cfg["workers"] else _run_on_workers(cfg)
    except DamagedCheckpointError as err:
        typer.echo(f"error: {err.reason} Run with --fresh to start over (it overwrites the checkpoint), or use "
                   f"another --out.", err=True)
        raise typer.Exit(2) from None
    except CheckpointMismatchError as err:
        more = f"Run with --rounds {err.checkpoint_round} or more to continue it, or use another --out, " \
            if isinstance(err, CheckpointAheadError) else "Use another --out, "
        typer.echo(f"error: {err.reason} {more}or --fresh to start over (it overwrites the checkpoint).", err=True)
        raise typer.Exit(2) from None


def _run_on_workers(cfg: dict) -> object:
    """The experiment of ``cfg`` with each round's clients split across ``workers``."""
    from tensorfleet.federated.backends.addresses import AllWorkersLostError, WorkerError
    from tensorfleet.federated.experiment import build_simulation

    sim = build_simulation(cfg)
    try:
        return sim.run()
    except (WorkerError, AllWorkersLostError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


@app.command("worker")
def worker(
    port: int = typer.Option(..., "--port", help="TCP port to serve on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the worker is reached at."),
    runtime: Optional[WorkerRuntime] = typer.Option(
        None, "--runtime", case_sensitive=False,
        help="tensorflow (a TensorFlow server, for backend='compiled' with workers: the current track) | tff "
             "(TFF's C++ worker_binary, for backend='tff': the tff track). Default: tff where "
             "tensorflow-federated imports, else tensorflow."),
    max_concurrent: int = typer.Option(-1, "--max-concurrent", help="Parallel calls per computation (<= 0: no limit; "
                                                                     "tff only)."),
    log_path: Optional[Path] = typer.Option(None, "--log", help="File for the worker's output (default: discarded; tff "
                                                           "only)."),
) -> None:
    """Serves one federated worker until SIGTERM or Ctrl-C, then stops it: a TensorFlow server for the compiled
    backend, or TFF's C++ worker for the tff backend."""
    import sys

    from tensorfleet.compat.tff import tff_available

    chosen = runtime or (WorkerRuntime.TFF if tff_available() else WorkerRuntime.TENSORFLOW)
    if chosen is WorkerRuntime.TENSORFLOW:
        for flag, value, default in (("--max-concurrent", max_concurrent, -1), ("--log", log_path, None)):
            if value != default:
                raise ValueError(f"{flag} applies to TFF's worker (--runtime tff). Received: {flag} {value} with "
                                 "--runtime tensorflow")
        from tensorfleet.federated.backends.compiled.workers import READY, serve as serve_tf

        def ready_tf(address: str) -> None:
            typer.echo(f"{READY} {address} (pid {os.getpid()}); SIGTERM or Ctrl-C stops it")
            sys.stdout.flush()

        raise typer.Exit(serve_tf(port, host=host, on_ready=ready_tf))

    from tensorfleet.federated.backends.worker import WorkerPortInUseError, serve

    def ready(w: object) -> None:
        typer.echo(f"TFF worker serving on {w.address} (pid {w.pid}); SIGTERM or Ctrl-C stops it")  # type: ignore[attr-defined]
        sys.stdout.flush()

    with _tff_needed():  # outside the next block: typer.Exit is a RuntimeError
        try:
            status = serve(port, host=host, max_concurrent=max_concurrent, log_path=log_path, on_ready=ready)
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
