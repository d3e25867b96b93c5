"""``tensorfleet tune``: a distributed Keras Tuner search of a script's ``build_model(hp)``.

The script defines ``build_model(hp)`` (a compiled Keras model from Keras Tuner's
hyperparameters) and ``data()`` (``(x, y, x_val, y_val)`` or ``(train_dataset, val_dataset)``).
Keras Tuner's chief oracle and ``--workers`` tuner workers run as processes on 127.0.0.1; the
table, JSON, plots and the best model are written to ``--out``.

Example:
    $ tensorfleet tune examples/tune_digits.py --workers 2 --max-trials 8 --objective val_accuracy
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

__all__ = ["FederatedObjective", "federated_tune_command", "k8s_tune_command", "register", "tune_command"]


def tune_command(
    ctx: typer.Context,
    script: Path = typer.Argument(..., help="The search script: defines build_model(hp) and data()."),
    workers: int = typer.Option(2, "--workers", "-n", help="Tuner worker processes (trials run at once)."),
    max_trials: int = typer.Option(10, "--max-trials", help="Trials in all (Hyperband: at most)."),
    objective: str = typer.Option("val_accuracy", "--objective", help="The metric to optimize, as fit logs it."),
    direction: Optional[str] = typer.Option(  # noqa: UP007
        None, "--direction", help="max or min (default: Keras Tuner infers it from the metric's name)."),
    algorithm: str = typer.Option("random", "--algorithm", help="random, bayesian or hyperband."),
    strategy: str = typer.Option("one_device", "--strategy", help="The strategy each trial trains under "
                                 "(one_device, mirrored, central_storage, auto)."),
    devices_per_trial: int = typer.Option(1, "--devices-per-trial", help="Devices of each trial's strategy "
                                          "(logical CPUs where there is no accelerator)."),
    epochs: int = typer.Option(5, "--epochs", help="Epochs per trial (Hyperband: its max_epochs)."),
    batch_size: int = typer.Option(32, "--batch-size", help="Batch size for data() given as arrays."),
    out_dir: Path = typer.Option(Path("tune_out"), "--out", help="Directory for the oracle's state and the results."),
    resume: Optional[bool] = typer.Option(  # noqa: UP007
        None, "--resume/--fresh", help="--resume: continue the search saved in --out (an error when there is "
        "none); --fresh: delete it and begin again. Neither: continue it if there is one, else begin."),
    seed: int = typer.Option(0, "--seed", help="The oracle's random seed."),
    max_restarts: int = typer.Option(3, "--max-restarts", help="Restarts of tuner workers the search allows."),
    pin_cores: bool = typer.Option(False, "--pin-cores", help="Pin each worker to one CPU core."),
) -> None:
    """Search hyperparameters with Keras Tuner's chief oracle and N tuner workers on 127.0.0.1.

    Shows each trial as it begins and ends with the trials done, running and the best so far;
    writes results.txt (the table), results.json, objective.png, hyperparameters.png and
    best_model.keras to --out. A worker that dies is started again and its trial runs again;
    after a chief that died, the same command continues from the oracle's saved state.
    """
    from tensorfleet.tuning.distributed import Supervision, TrialOptions, TuningError, describe, search
    from tensorfleet.tuning.task import TunerKerasError

    verbose = bool(ctx.find_root().params.get("verbose"))
    try:
        trial = TrialOptions(objective=objective, direction=direction, strategy=strategy,
                             devices_per_trial=devices_per_trial, batch_size=batch_size, seed=seed, pin_cores=pin_cores)
        result = search(script, out_dir=out_dir, workers=workers, max_trials=max_trials, algorithm=algorithm,
                        epochs=epochs, trial=trial, supervision=Supervision(max_restarts=max_restarts), resume=resume,
                        log=typer.echo, verbose=verbose)
    except TunerKerasError as exc:  # models of the Keras Keras Tuner does not drive here: bad input, status 2
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except TuningError as exc:  # the search ran and could not finish: status 1, not a usage error
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:  # the processes are stopped by then; the oracle's state is on disk
        typer.echo(f"interrupted: the search is saved in {str(out_dir)!r}; the same command continues it.", err=True)
        raise typer.Exit(130) from None
    typer.echo((result.out_dir / "results.txt").read_text().rstrip())
    typer.echo(describe(result))
    typer.echo(f"results: {result.out_dir}/results.json, objective.png, hyperparameters.png")


def k8s_tune_command(
    script: str = typer.Argument(..., help="The search script's absolute path inside the image."),
    image: str = typer.Option(..., "--image", help="Container image with the script and tensorfleet[tuning]."),
    workers: int = typer.Option(..., "--workers", help="Tuner worker pods."),
    max_trials: int = typer.Option(..., "--max-trials", help="Trials in all (Hyperband: at most)."),
    objective: str = typer.Option("val_accuracy", "--objective"),
    direction: Optional[str] = typer.Option(None, "--direction", help="max or min."),  # noqa: UP007
    algorithm: str = typer.Option("random", "--algorithm", help="random, bayesian or hyperband."),
    strategy: str = typer.Option("one_device", "--strategy"),
    devices_per_trial: int = typer.Option(1, "--devices-per-trial"),
    epochs: int = typer.Option(5, "--epochs"),
    batch_size: int = typer.Option(32, "--batch-size"),
    name: str = typer.Option("tune", "--name", help="Prefix of the objects' names (a DNS label)."),
    namespace: str = typer.Option("default", "--namespace"),
    port: int = typer.Option(8000, "--port", help="The oracle's port."),
    storage: str = typer.Option("10Gi", "--storage", help="Size of the shared ReadWriteMany claim."),
    storage_class: Optional[str] = typer.Option(None, "--storage-class"),  # noqa: UP007
    cpu: str = typer.Option("1", "--cpu"),
    memory: str = typer.Option("2Gi", "--memory"),
    out_path: Path = typer.Option(Path("tune.yaml"), "--output", "-o", help="Where the YAML goes."),
) -> None:
    """Write schema-checked manifests for a search on Kubernetes: Keras Tuner's oracle (a Job and its
    Service), the tuner workers (an Indexed Job) and the claim they share."""
    from tensorfleet.tuning.k8s import tune_manifests, write

    docs = tune_manifests(script=script, image=image, workers=workers, max_trials=max_trials, objective=objective,
                          direction=direction, algorithm=algorithm, strategy=strategy,
                          devices_per_trial=devices_per_trial, epochs=epochs, batch_size=batch_size, name=name,
                          namespace=namespace, port=port, storage=storage, storage_class=storage_class, cpu=cpu,
                          memory=memory)
    path = write(docs, out_path)
    typer.echo(f"wrote {path}: " + ", ".join(f"{d['kind']} {d['metadata']['name']}" for d in docs))


class FederatedObjective(str, Enum):
    """What a federated trial is scored by: the last round's central test accuracy (larger is
    better) or the first round that reaches ``--target`` (smaller is better; never: rounds + 1)."""

    FINAL_ACCURACY = "final_accuracy"
    ROUNDS_TO_TARGET = "rounds_to_target"


def _federated_space(cfg: dict[str, Any]) -> Any:
    clients = cfg["clients"] or 100
    most = max(2, min(20, clients - cfg["eval_clients"]))

    def space(hp: Any) -> None:
        hp.Float("client_learning_rate", 1e-3, 1.0, sampling="log")
        hp.Float("server_learning_rate", 0.1, 3.0, sampling="log")
        hp.Int("local_epochs", 1, 3)
        hp.Int("clients_per_round", min(2, most), most)

    return space


def federated_trial(cfg: dict[str, Any], values: dict[str, Any], objective: FederatedObjective,
                    target: float) -> float:
    """One trial: the experiment of ``cfg`` with the trial's ``values``, scored by ``objective``."""
    from tensorfleet.federated.experiment import run_experiment

    history = run_experiment({**cfg, **values, "out_dir": None, "progress": False, "checkpoint_every": 0})
    if objective is FederatedObjective.FINAL_ACCURACY:
        return float(history.final("test_accuracy"))
    reached = history.rounds_to("test_accuracy", target)
    return float(reached if reached is not None else cfg["rounds"] + 1)


def federated_tune_command(
    config: Path = typer.Option(..., "--config", help="The experiment's YAML (the keys of 'federated run')."),
    max_trials: int = typer.Option(10, "--max-trials"),
    objective: str = typer.Option("final_accuracy", "--objective", help="final_accuracy or rounds_to_target."),
    target: float = typer.Option(0.8, "--target", help="The test accuracy rounds_to_target counts rounds to."),
    algorithm: str = typer.Option("random", "--algorithm", help="random or bayesian."),
    out_dir: Path = typer.Option(Path("federated_tune_out"), "--out",
                                 help="Directory for the oracle's state and the results."),
    seed: int = typer.Option(0, "--seed", help="The oracle's random seed."),
    resume: Optional[bool] = typer.Option(  # noqa: UP007
        None, "--resume/--fresh", help="--resume: continue the search saved in --out (an error when there is "
        "none); --fresh: delete it and begin again. Neither: continue it if there is one, else begin."),
) -> None:
    """Search client and server learning rates, local epochs and clients per round with Keras Tuner's
    oracle, each trial a federated simulation of the experiment in --config (on the compiled backend
    where it applies, unless the config names a backend)."""
    from tensorfleet.federated.experiment import load_config, resolve_config
    from tensorfleet.tuning.blackbox import search_function
    from tensorfleet.tuning.distributed import describe
    from tensorfleet.validation import choice, number

    goal = choice(FederatedObjective, "objective", objective)
    number("target", target, above=0, maximum=1)
    loaded = load_config(config)
    loaded.setdefault("backend", "auto")  # the compiled backend where it gives TFF's result, TFF elsewhere
    cfg = resolve_config(loaded)
    result = search_function(lambda values: federated_trial(cfg, values, goal, target), _federated_space(cfg),
                             objective=goal.value, direction="max" if goal is FederatedObjective.FINAL_ACCURACY
                             else "min", max_trials=max_trials, out_dir=out_dir, algorithm=algorithm, seed=seed,
                             resume=resume, log=typer.echo)
    typer.echo((result.out_dir / "results.txt").read_text().rstrip())
    typer.echo(describe(result))


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_command)
