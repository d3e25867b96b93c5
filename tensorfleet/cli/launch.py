"""``tensorfleet launch``: run a training script as a local tf.distribute cluster.

The command has three modes, chosen by the options given (:data:`MODES` declares which options each
takes; an option given to a mode that does not take it is refused, naming both):

* a script (the plain mode):
    $ tensorfleet launch --workers 2 --max-restarts 2 train.py --epochs 6
  with ``--mesh``, the workers are the processes of one DTensor mesh (a ``Mesh`` in the script spans them):
    $ tensorfleet launch --workers 2 --mesh train_on_mesh.py
* a migratable job (``build_model()`` and ``data()``; :mod:`tensorfleet.cluster.migration`), chosen by
  ``--strategy``, ``--checkpoint-dir`` or ``--resume-from``; ``--resume-from DIR`` moves it to the
  strategy and world size given:
    $ tensorfleet launch --resume-from ckpt --strategy parameter_server --workers 2 --ps 1 job.py
* ``--share``: two or more migratable jobs share these devices by time slices at step boundaries
  (:func:`tensorfleet.cluster.multiplex.share`), each its fraction of the steps; the options come
  first and apply to every job, each ``--share FRACTION SCRIPT [-- ARGS...]`` is one job:
    $ tensorfleet launch --checkpoint-dir ckpt --epochs 2 --share 0.75 a.py --share 0.25 b.py

In every mode a script's own arguments follow it (``--`` first is optional) and reach it as its
``sys.argv[1:]``.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, List, Mapping, Optional

import typer

from tensorfleet.cluster.elastic import BatchPolicy
from tensorfleet.cluster.migration import MigrationStrategy
from tensorfleet.cluster.processes import JobMode

__all__ = ["MODES", "MODE_NAMES", "check_options", "launch_command", "mode_of", "mode_table", "register"]

PLAIN, MIGRATE, SHARE = "plain", "migrate", "share"
#: How the messages and the docs name each mode.
MODE_NAMES = {PLAIN: "a script (plain launch)", MIGRATE: "a migratable job (--strategy, --checkpoint-dir or "
              "--resume-from)", SHARE: "shared devices (--share)"}
_ALL = (PLAIN, MIGRATE, SHARE)
_JOBS = (MIGRATE, SHARE)
#: The modes each option of ``launch`` applies in (by the parameter's name); given to another, it is refused.
MODES: dict[str, tuple[str, ...]] = {
    "workers": _ALL, "ps": _ALL, "chief": (PLAIN,), "evaluator": (PLAIN,), "evaluator_timeout": (PLAIN,),
    "max_restarts": (PLAIN, MIGRATE), "timeout": _ALL, "hang_timeout": (PLAIN, MIGRATE),
    "backoff": (PLAIN, MIGRATE), "ports": (PLAIN, MIGRATE), "backup_dir": (PLAIN,), "mode_option": (PLAIN, MIGRATE),
    "profile_steps": (PLAIN,), "profile_dir": (PLAIN,), "strategy": _JOBS, "devices": _JOBS,
    "checkpoint_dir": _JOBS, "resume_from": (MIGRATE,), "epochs": _JOBS, "global_batch_size": _JOBS,
    "batch_policy": _JOBS, "stop_at_step": _JOBS, "save_every": _JOBS, "share": (SHARE,), "quantum": (SHARE,),
    "timeline": (SHARE,), "mesh": (PLAIN,), "scale_lr": _ALL,
}
#: Why an option does not apply to a mode, where a reason helps (option, mode) -> what to do instead.
_WHY = {
    ("backup_dir", MIGRATE): "a migratable job's backups are its checkpoints in --checkpoint-dir",
    ("backup_dir", SHARE): "a shared job's backups are its checkpoints in --checkpoint-dir/<job>",
    ("chief", MIGRATE): "its strategy decides the tasks (parameter_server adds a chief)",
    ("chief", SHARE): "its strategy decides the tasks (parameter_server adds a chief)",
    ("evaluator", MIGRATE): "its task program trains only", ("evaluator", SHARE): "its task program trains only",
    ("profile_steps", MIGRATE): "it trains step by step, without the fit that --profile-steps records",
    ("profile_steps", SHARE): "it trains step by step, without the fit that --profile-steps records",
    ("max_restarts", SHARE): "a restarted job would lose its place in the time slices; restart it alone, "
                             "with --checkpoint-dir DIR/<job>",
    ("hang_timeout", SHARE): "a job waiting for its slice is silent by design; use --timeout",
    ("ports", SHARE): "each job takes free ports of its own",
    ("resume_from", SHARE): "each job continues from its checkpoint in --checkpoint-dir/<job> when there is one",
    ("mesh", MIGRATE): "its placement decides the devices (--strategy mesh: a mesh in one process)",
    ("mesh", SHARE): "its placement decides the devices (--strategy mesh: a mesh in one process)",
}
#: Options that apply only together with another: (option, the one it needs).
_NEEDS = {"evaluator_timeout": "evaluator", "profile_dir": "profile_steps", "backoff": "max_restarts"}


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
    script: Optional[Path] = typer.Argument(  # noqa: UP007 - none with --share, whose jobs follow their shares
        None, help="The training script every trainer task runs."),
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
    mode_option: JobMode = typer.Option(JobMode.AUTO, "--mode", help="What a restart restarts: every task (collective) "
                                 "or a failed worker only (parameter_server); auto: by --ps."),
    profile_steps: Optional[str] = typer.Option(  # noqa: UP007
        None, "--profile-steps", help="Record a profiler trace of these steps of the first fit on every task "
        "(FIRST-LAST, e.g. 20-30); read it with 'tensorfleet profile report DIR'."),
    profile_dir: Path = typer.Option(Path("profile"), "--profile-dir", help="Where --profile-steps writes, "
                                     "one folder per task."),
    mesh: bool = typer.Option(False, "--mesh", help="The workers are the processes of one DTensor mesh: a Mesh made in "
                              "the script spans the devices of every worker, each its share (workers only)."),
    scale_lr: Optional[str] = typer.Option(  # noqa: UP007
        None, "--scale-lr", metavar="RULE:REFERENCE", help="Scale the script's learning rate with its global batch "
        "(RULE linear or sqrt; REFERENCE the global batch the rate is for) at each start, restarts included "
        "(a script: TENSORFLEET_SCALE_LR, applied by fault_tolerance.callbacks(global_batch_size=...); a migratable "
        "job: at each placement)."),
    strategy: Optional[MigrationStrategy] = typer.Option(  # noqa: UP007
        None, "--strategy", help="Run SCRIPT as a migratable job (build_model() and data()) under this strategy."),
    devices: int = typer.Option(1, "--devices", help="Local devices of --strategy mirrored."),
    checkpoint_dir: Optional[Path] = typer.Option(  # noqa: UP007
        None, "--checkpoint-dir", help="Where a migratable job writes its checkpoints (continues from one there)."),
    resume_from: Optional[Path] = typer.Option(  # noqa: UP007
        None, "--resume-from", help="Continue a migratable job from its checkpoint in this directory, under "
        "--strategy and its world size (default: the checkpoint's strategy)."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Epochs of a migratable job."),  # noqa: UP007
    global_batch_size: Optional[int] = typer.Option(  # noqa: UP007
        None, "--global-batch-size", help="Global batch of a migratable job."),
    batch_policy: Optional[BatchPolicy] = typer.Option(  # noqa: UP007
        None, "--batch-policy", help="What stays fixed when the world size changes."),
    stop_at_step: Optional[int] = typer.Option(  # noqa: UP007
        None, "--stop-at-step", help="Stop a migratable job after this step, saved and ready to move."),
    save_every: int = typer.Option(0, "--save-every", help="Checkpoint a migratable job every N steps."),
    share: Optional[List[float]] = typer.Option(  # noqa: UP006,UP007
        None, "--share", metavar="FRACTION SCRIPT",
        help="Time-slice migratable jobs on these devices: '--share 0.75 a.py --share 0.25 b.py' "
        "gives each job its share of the steps (shares sum to 1); checkpoints in --checkpoint-dir/<job>."),
    quantum: int = typer.Option(8, "--quantum", help="Steps in one round of --share, split by the shares."),
    timeline: Optional[Path] = typer.Option(  # noqa: UP007
        None, "--timeline", help="The PNG timeline of --share's slices (default: --checkpoint-dir/timeline.png)."),
) -> None:
    """Start one process per task on 127.0.0.1, each with its TF_CONFIG; restart on failure.

    Three modes, chosen by the options: a script; a migratable job (--strategy, --checkpoint-dir or
    --resume-from); jobs sharing the devices (--share). An option the mode does not take is refused
    (the table: docs, reference of the tensorfleet command). The script's own arguments follow it.
    With --mesh the workers are the processes of one mesh: a Mesh made in the script spans them all.

    Output lines are prefixed with their task (e.g. worker:1); a progress bar shows its state every
    2 s, one line each; TensorFlow's start-up noise is left out (shown with --verbose); Ctrl-C and SIGTERM reach
    every task (SIGKILL follows after a grace period); when training ends an evaluator still at work is told so
    and waited for (--evaluator-timeout) to evaluate the last checkpoint; the exit status is the chief's (worker
    0's without a chief) or the first failure's.
    """
    from tensorfleet.cli.main import click_exceptions, verbose

    given = _given(ctx)
    mode = check_options(given, ctx.params, _flags(ctx))
    if scale_lr is not None:
        from tensorfleet.strategies.large_batch import parse_scale_lr

        parse_scale_lr(scale_lr, name="--scale-lr")
    script_args = list(args or [])
    if script_args[:1] == ["--"]:  # `launch train.py -- --epochs 3`
        script_args = script_args[1:]
    migration: dict[str, Any] = {
                 "strategy": strategy, "devices": devices, "workers": workers if "workers" in given else None,
                 "ps": ps, "verbose": verbose(ctx),
                 "changes": {"epochs": epochs, "global_batch_size": global_batch_size, "policy": batch_policy,
                             "stop_at_step": stop_at_step, "save_every": save_every, "scale_lr": scale_lr}}
    if mode == SHARE:
        _finish_shared(_share(_shared_jobs(share or [], script, list(args or [])), directory=checkpoint_dir,
                              quantum=quantum, timeline=timeline, timeout=timeout, **migration))
        return
    if script is None:
        raise click_exceptions().MissingParameter(ctx=ctx, param_type="argument", param_hint="'SCRIPT'")
    _reject_unknown_option(ctx, script)
    from tensorfleet.cluster.launcher import Recovery, TaskCommand, TaskOutput, Timeouts, launch

    port_list = None
    if ports is not None:
        try:
            port_list = [int(p) for p in ports.split(",") if p.strip()]
        except ValueError:
            raise ValueError(f"--ports must be comma-separated integers. Received: --ports={ports!r}") from None
    if mode == MIGRATE:
        directory = resume_from or checkpoint_dir
        resume = resume_from is not None or (directory is not None and _has_checkpoint(directory))
        _finish(_migrate(script, script_args, directory=directory, resume=resume,
                         launch={"max_restarts": max_restarts, "backoff": backoff, "timeout": timeout,
                                 "hang_timeout": hang_timeout, "ports": port_list, "mode": mode_option},
                         **migration))
        return
    env, runner = _profiling(profile_steps, profile_dir)
    if scale_lr is not None:
        from tensorfleet.cluster.contract import ENV_SCALE_LR

        env[ENV_SCALE_LR] = scale_lr.strip()
    result = launch(
        script, script_args, workers=workers, ps=ps, chief=chief, evaluator=evaluator, ports=port_list,
        mode=mode_option,
        recovery=Recovery(max_restarts=max_restarts, backoff=backoff, backup_dir=backup_dir),
        timeouts=Timeouts(timeout=timeout, hang_timeout=hang_timeout, evaluator_timeout=evaluator_timeout),
        output=TaskOutput(verbose=verbose(ctx)), command=TaskCommand(env=env, runner=runner), check=False, mesh=mesh,
    )
    _finish(result)
    if profile_steps is not None:
        typer.echo(f"profile: tensorfleet profile report {env['TENSORFLEET_PROFILE_DIR']}")


def _given(ctx: typer.Context) -> set[str]:
    """The options given on the command line (or by the environment), by parameter name."""
    return {name for name in MODES if (source := ctx.get_parameter_source(name)) is not None
            and source.name not in ("DEFAULT", "DEFAULT_MAP")}


def _flags(ctx: typer.Context) -> dict[str, str]:
    """Each option's long flag, by parameter name."""
    return {param.name: next((o for o in getattr(param, "opts", ()) if o.startswith("--")), param.name)
            for param in ctx.command.params if param.name}


def mode_of(given: set[str]) -> str:
    """The mode the given options choose: ``--share``; else a migratable job's options; else a plain launch."""
    if "share" in given:
        return SHARE
    return MIGRATE if given & {"strategy", "checkpoint_dir", "resume_from"} else PLAIN


def check_options(given: set[str], values: Mapping[str, Any], flags: Mapping[str, str]) -> str:
    """The mode of ``launch`` the ``given`` options choose, once each of them applies there (:data:`MODES`);
    else one clear error naming the option, its value, the mode and where it applies."""
    mode = mode_of(given)
    for name in (n for n in MODES if n in given):
        if mode not in MODES[name]:
            why = _WHY.get((name, mode))
            where = " and ".join(MODE_NAMES[m] for m in MODES[name])
            raise ValueError(f"{flags[name]} does not apply to {MODE_NAMES[mode]}" + (f": {why}" if why else "")
                             + f". It applies to {where}. Received: {_shown(flags[name], values.get(name))}")
    for name, needed in _NEEDS.items():
        if name in given and needed not in given:
            raise ValueError(f"{flags[name]} applies with {flags[needed]}. Received: "
                             f"{_shown(flags[name], values.get(name))} without {flags[needed]}")
    return mode


def _shown(flag: str, value: Any) -> str:
    """The option as it was given (numbers as typed: 5, not 5.0)."""
    if isinstance(value, bool):
        return flag
    values = value if isinstance(value, list) else [value]
    return " ".join(f"{flag} {v:g}" if isinstance(v, float) else f"{flag} {getattr(v, 'value', v)}" for v in values)


def _has_checkpoint(directory: Path) -> bool:
    from tensorfleet.cluster.jobstate import LATEST

    return (directory / LATEST).exists()


def mode_table(flags: Mapping[str, str]) -> str:
    """The Markdown table of which options each mode takes (docs/ref-cli.md holds it; a test compares)."""
    columns = {PLAIN: "script", MIGRATE: "migratable job", SHARE: "`--share`"}
    rows = ["| option | " + " | ".join(columns.values()) + " |", "|---|---|---|---|"]
    for name, modes in MODES.items():
        chosen = mode_of({name})  # an option that chooses a mode never meets one ranked below it
        cells = ["yes" if m in modes else f"chooses {columns[chosen]}" if _ALL.index(chosen) > _ALL.index(m)
                 else "refused" for m in _ALL]
        needs = f" (with `{flags[_NEEDS[name]]}`)" if name in _NEEDS else ""
        rows.append(f"| `{flags[name]}`{needs} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _finish(result: Any) -> None:
    if result.returncode != 0 and result.error:
        typer.echo(f"error: {result.error}", err=True)
    if result.returncode:
        raise typer.Exit(result.returncode)


def _migrate(script: Path, args: list[str], *, strategy: MigrationStrategy | None, devices: int, workers: int | None,
             ps: int, directory: Path | None, resume: bool, changes: dict[str, Any], verbose: bool,
             launch: dict[str, Any]) -> Any:
    """Runs a migratable job (see :func:`tensorfleet.cluster.migration.migrate`) with the launcher's options
    ``launch`` (restarts, time-outs, ports, what a restart restarts)."""
    from tensorfleet.cluster.jobstate import read_state
    from tensorfleet.cluster.migration import MigrationError, migrate

    if directory is None:
        raise MigrationError("A migratable job (--strategy) keeps its checkpoints in a directory: give "
                             "--checkpoint-dir DIR to start one, or --resume-from DIR to continue one.")
    progress = read_state(directory)[0] if resume else None
    if strategy is None:
        if progress is None:
            raise MigrationError("--checkpoint-dir starts a migratable job: give its --strategy too.")
        strategy = MigrationStrategy(progress.strategy)
    to, run = _placement_and_run(strategy, devices, workers, ps, progress, changes)
    return migrate(script, directory, to=to, run=run, resume=resume, check=False, log=_echo, verbose=verbose, args=args,
                   **launch)


def _placement_and_run(strategy: MigrationStrategy, devices: int, workers: int | None, ps: int, progress: Any,
                       changes: dict[str, Any]) -> tuple[Any, Any]:
    """Where a migratable job runs, and its run options: the checkpoint's (``progress``) with ``changes``.
    ``workers``: ``None`` when not given (2 for strategies over processes, 1 for those in one process)."""
    from tensorfleet.cluster.migration import Placement, RunOptions

    if workers is None:
        workers = 1 if strategy.in_one_process else 2
    to = Placement(strategy, devices=devices, workers=workers, ps=ps)
    given = {k: v for k, v in changes.items() if v is not None}
    return to, RunOptions.from_progress(progress, **given) if progress is not None else RunOptions(**given)


def _shared_jobs(shares: list[float], script: Path | None,
                 args: list[str]) -> list[tuple[float, Path, list[str]]]:
    """``(share, script, its arguments)`` of each job of ``--share S1 A.PY [-- ARGS] --share S2 B.PY ...``: the
    shares before the first script are the option's; the rest of the line reaches us as the script's arguments.
    A script's own arguments follow ``--`` after it, up to the next ``--share``."""
    tokens, shares = [*([str(script)] if script is not None else []), *args], list(shares)
    jobs: list[tuple[Path, list[str]]] = []  # (script, its arguments), the shares apart
    while tokens:
        token = tokens.pop(0)
        if token == "--share" or token.startswith("--share="):
            value = token.split("=", 1)[1] if "=" in token else (tokens.pop(0) if tokens else "")
            try:
                shares.append(float(value))
            except ValueError:
                raise ValueError(f"--share takes a fraction of the devices between 0 and 1, then the job's script "
                                 f"(--share 0.25 b.py). Received: --share {value!r}") from None
        elif token == "--" and jobs:
            while tokens and not (tokens[0] == "--share" or tokens[0].startswith("--share=")):
                jobs[-1][1].append(tokens.pop(0))
        elif token.startswith("-"):
            raise ValueError(f"With --share, the options of launch come before the first --share; after it only "
                             f"'--share FRACTION SCRIPT' pairs follow, each script's own arguments after '--' "
                             f"(--share 0.25 b.py -- --lr 0.1). Received: {token!r}")
        else:
            jobs.append((Path(token), []))
    if len(shares) != len(jobs):
        raise ValueError(f"Each shared job is '--share FRACTION SCRIPT'. Received: {len(shares)} share(s) "
                         f"{shares} and {len(jobs)} script(s) {[str(s) for s, _ in jobs]}")
    for path, _ in jobs:
        if not path.is_file():
            raise FileNotFoundError(f"The script of a shared job does not exist. Received: {str(path)!r}")
    return [(fraction, path, job_args) for fraction, (path, job_args) in zip(shares, jobs)]


def _share(jobs: list[tuple[float, Path, list[str]]], *, directory: Path | None, quantum: int,
           timeline: Path | None, timeout: float | None, strategy: MigrationStrategy | None, devices: int,
           workers: int | None, ps: int, changes: dict[str, Any], verbose: bool) -> tuple[Any, list[str], Path | None]:
    """Runs the jobs time-sliced by their shares (:func:`tensorfleet.cluster.multiplex.share`); the result,
    the jobs' names and the timeline written (``None`` when a job failed before its first step)."""
    from tensorfleet.cluster.contract import STEP_DONE
    from tensorfleet.cluster.jobstate import LATEST, read_state
    from tensorfleet.cluster.migration import MigrationError
    from tensorfleet.cluster.multiplex import SharedJob, share
    from tensorfleet.io import check_writable

    if directory is None:
        raise MigrationError("Shared jobs keep their checkpoints in a directory each: give --checkpoint-dir DIR "
                             "(a job's is DIR/<its script's name>; an existing one is continued).")
    names = [path.stem for _, path, _ in jobs]
    if len(set(names)) != len(names):
        raise MigrationError(f"Shared jobs need scripts of different names (each names its checkpoint directory). "
                             f"Received: {[str(path) for _, path, _ in jobs]}")
    timeline = timeline if timeline is not None else directory / "timeline.png"
    check_writable(timeline)
    shared = []
    for (fraction, path, args), name in zip(jobs, names):
        progress = read_state(directory / name)[0] if (directory / name / LATEST).exists() else None
        kind = strategy or (MigrationStrategy(progress.strategy) if progress else MigrationStrategy.MIRRORED)
        to, run = _placement_and_run(kind, devices, workers, ps, progress, changes)
        shared.append(SharedJob(path, directory / name, to, run, share=fraction, args=tuple(args)))

    def echo(line: str) -> None:  # "[job 0] [worker:0] ..." -> "[a] [worker:0] ..."
        index, _, rest = line[len("[job "):].partition("] ")
        if not verbose and STEP_DONE.read(rest) is not None:
            return  # the scheduler's step marks: the summary counts them
        typer.echo(f"[{names[int(index)]}] {rest}")

    result = share(shared, quantum=quantum, log=echo, timeout=timeout)
    if not all(result.steps):
        return result, names, None
    return result, names, result.plot(timeline, names=[f"{n} (share {f:g})" for n, (f, _, _) in zip(names, jobs)])


def _finish_shared(outcome: tuple[Any, list[str], Path | None]) -> None:
    result, names, timeline = outcome
    shares = result.shares() if timeline is not None else [None] * len(names)  # no shares without every job's steps
    for name, launched, steps, got, asked in zip(names, result.results, result.steps, shares, result.requested):
        what = f"{got:.2f} of the steps while all jobs ran" if got is not None else "no shares measured"
        typer.echo(f"{name}: {len(steps)} steps, {what} (share {asked:g}), exit status {launched.returncode}")
        if launched.returncode and launched.error:
            typer.echo(f"error: {name}: {launched.error}", err=True)
    typer.echo(f"makespan {result.makespan:.1f} s" + (f"; timeline: {timeline}" if timeline is not None else ""))
    failed = [r.returncode for r in result.results if r.returncode]
    if failed:
        raise typer.Exit(failed[0])


def _echo(line: str) -> None:
    typer.echo(line)


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
