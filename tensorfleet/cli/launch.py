"""``tensorfleet launch``: run a training script as a local tf.distribute cluster.

Example:
    $ tensorfleet launch --workers 2 --max-restarts 2 train.py --epochs 6
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import List, Optional

import typer

__all__ = ["register", "launch_command"]


def _reject_unknown_option(ctx: typer.Context, script: Path) -> None:
    """Options of ``launch`` come before the script; a misspelt one must not pass for the script."""
    text = str(script)
    if not text.startswith("-"):
        return
    from tensorfleet.cli.main import click_exceptions

    known = sorted(opt for param in ctx.command.params for opt in getattr(param, "opts", ()) if opt.startswith("--"))
    close = difflib.get_close_matches(text.split("=", 1)[0], known, n=1)
    message = f"No such option: {text}" + (f". Did you mean {close[0]}?" if close else "")
    raise click_exceptions().NoSuchOption(text, message=message, ctx=ctx)


def launch_command(
    ctx: typer.Context,
    script: Path = typer.Argument(..., help="The training script every trainer task runs."),
    args: Optional[List[str]] = typer.Argument(None, help="Arguments for the script."),  # noqa: UP006,UP007
    workers: int = typer.Option(2, "--workers", "-n", help="Number of worker tasks."),
    ps: int = typer.Option(0, "--ps", help="Number of parameter-server tasks (adds a chief)."),
    chief: bool = typer.Option(False, "--chief", help="Add a chief task."),
    evaluator: bool = typer.Option(False, "--evaluator", help="Add an evaluator task."),
    evaluator_timeout: float = typer.Option(
        300.0, "--evaluator-timeout", help="Seconds the evaluator may take, once training has ended, to evaluate "
        "the last checkpoint before it is stopped."),
    max_restarts: int = typer.Option(0, "--max-restarts", help="Restarts allowed after failures."),
    timeout: Optional[float] = typer.Option(  # noqa: UP007
        None, "--timeout", help="Seconds one attempt may run before it counts as hung and is restarted."),
    hang_timeout: Optional[float] = typer.Option(  # noqa: UP007
        None, "--hang-timeout", help="Seconds without output from any task before the attempt counts as hung."),
    backoff: float = typer.Option(1.0, "--backoff", help="Seconds before the first restart (doubles each time)."),
    ports: Optional[str] = typer.Option(  # noqa: UP007
        None, "--ports", help="Comma-separated ports, one per task (chief, workers, ps, evaluator)."),
    backup_dir: Optional[Path] = typer.Option(  # noqa: UP007
        None, "--backup-dir", help="Backup directory shared by the tasks (TENSORFLEET_BACKUP_DIR)."),
    mode: str = typer.Option("auto", "--mode", help="auto, collective or parameter_server."),
    profile_steps: Optional[str] = typer.Option(  # noqa: UP007
        None, "--profile-steps", help="Record a profiler trace of these steps of the first fit on every task "
        "(FIRST-LAST, e.g. 20-30); read it with 'tensorfleet profile report DIR'."),
    profile_dir: Path = typer.Option(Path("profile"), "--profile-dir", help="Where --profile-steps writes, "
                                     "one folder per task."),
) -> None:
    """Start one process per task on 127.0.0.1, each with its TF_CONFIG; restart on failure.

    Output lines are prefixed with their task (e.g. worker:1); a progress bar shows its state every
    2 s, one line each; TensorFlow's start-up noise is left out (shown with --verbose); Ctrl-C and SIGTERM reach every
    task (SIGKILL follows after a grace period); when training ends an evaluator still at work is told so and
    waited for (--evaluator-timeout) to evaluate the last checkpoint; the exit status is the chief's (worker 0's without a chief) or the first failure's.
    """
    _reject_unknown_option(ctx, script)
    from tensorfleet.cli.main import verbose
    from tensorfleet.cluster.launcher import launch

    port_list = None
    if ports is not None:
        try:
            port_list = [int(p) for p in ports.split(",") if p.strip()]
        except ValueError:
            raise ValueError(f"--ports must be comma-separated integers. Received: --ports={ports!r}") from None
    script_args = list(args or [])
    if script_args[:1] == ["--"]:  # `launch train.py -- --epochs 3`
        script_args = script_args[1:]
    env, runner = _profiling(profile_steps, profile_dir)
    result = launch(
        script, script_args, workers=workers, ps=ps, chief=chief, evaluator=evaluator, ports=port_list,
        mode=mode, max_restarts=max_restarts, backoff=backoff, timeout=timeout, hang_timeout=hang_timeout,
        backup_dir=backup_dir, quiet=not verbose(ctx), check=False, env=env, runner=runner,
        evaluator_timeout=evaluator_timeout,
    )
    if result.returncode != 0 and result.error:
        typer.echo(f"error: {result.error}", err=True)
    if result.returncode:
        raise typer.Exit(result.returncode)
    if profile_steps is not None:
        typer.echo(f"profile: tensorfleet profile report {env['TENSORFLEET_PROFILE_DIR']}")


def _profiling(steps: str | None, directory: Path) -> tuple[dict[str, str], tuple[str, ...]]:
    """The tasks' environment and runner that record ``steps`` of each task's first fit under ``directory``."""
    if steps is None:
        return {}, ()
    from tensorfleet.io import check_writable
    from tensorfleet.profiling.recorder import ENV_DIR, ENV_STEPS, StepRange

    parsed = StepRange.parse(steps, name="--profile-steps")
    check_writable(directory / "worker-0" / "probe")
    return ({ENV_STEPS: str(parsed), ENV_DIR: str(directory.resolve())},
            ("-m", "tensorfleet.profiling.autorun"))


def register(app: typer.Typer) -> None:
    """Adds ``launch`` to the ``tensorfleet`` command."""
    app.command(
        "launch",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(launch_command)
