"""``tensorfleet profile``: where a recorded job's step time went, on every worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

__all__ = ["NAME", "app"]

NAME = "profile"
app = typer.Typer(help="Profiles recorded with tensorfleet.profiling: analyse them.", no_args_is_help=True)


@app.command("report")
def report(
    directory: Path = typer.Argument(..., help="The directory the capture wrote (one sub-directory per task)."),
    out: Optional[Path] = typer.Option(  # noqa: UP007 - typer needs Optional here
        None, "--out", help="Where to write profile.json, profile.png and trace.json (default: DIRECTORY)."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON instead of the table."),
    skip_first: bool = typer.Option(
        True, "--skip-first/--keep-first", help="Leave out each task's first recorded step (profiler start-up)."),
) -> None:
    """Per-task step breakdown (compute, communication, input, idle), the verdict, and the files.

    Example: tensorfleet profile report profile/
    """
    from tensorfleet.io import check_writable
    from tensorfleet.profiling.breakdown import analyze
    from tensorfleet.profiling.report import REPORT_FILES, format_table, write_report

    target = out if out is not None else directory
    if directory.is_dir():
        check_writable(target / REPORT_FILES["json"])
    profile = analyze(directory, skip_first=skip_first)
    paths = write_report(profile, target)
    if as_json:
        typer.echo(json.dumps(profile.to_dict(), indent=2))
        return
    typer.echo(format_table(profile))
    typer.echo("")
    typer.echo(f"wrote {paths['json']}, {paths['png']} and {paths['trace']} (open it in ui.perfetto.dev); "
               f"TensorBoard: tensorboard --logdir {directory}")
