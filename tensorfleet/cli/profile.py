"""``tensorfleet profile``: where a recorded job's step time went, on every worker."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import typer

from tensorfleet.planner.collectives import AllReduceAlgorithm

__all__ = ["NAME", "app"]

NAME = "profile"
app = typer.Typer(help="Profiles recorded with tensorfleet.profiling: analyse them.", no_args_is_help=True)


@app.command("report")
def report(
    source: Path = typer.Argument(..., metavar="DIRECTORY",
                                  help="The directory the capture wrote (one sub-directory per task)."),
    out_dir: Optional[Path] = typer.Option(  # noqa: UP007 - typer needs Optional here
        None, "--out", help="Where to write profile.json, profile.png and trace.json (default: DIRECTORY)."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON instead of the table."),
    skip_first: bool = typer.Option(
        True, "--skip-first/--keep-first", help="Leave out each task's first recorded step (profiler start-up)."),
    params: Optional[str] = typer.Option(  # noqa: UP007
        None, "--params", help="The model's trainable parameters (4.7M, 125000): set the measured "
        "communication beside the planner's all-reduce of their gradients."),
    bandwidth: Optional[str] = typer.Option(  # noqa: UP007
        None, "--bandwidth", help="With --params: the link's bandwidth, with a unit (0.33GB/s, 10Gbps)."),
    latency: str = typer.Option("5us", "--latency", help="With --params: per-message latency (1290us, 1ms)."),
    algorithm: Optional[AllReduceAlgorithm] = typer.Option(  # noqa: UP007
        None, "--algorithm", help="With --params: the planner's algorithm (default: ps for a parameter-server "
        "job, else ring)."),
    bytes_per_param: int = typer.Option(4, "--bytes-per-param", help="With --params: gradient bytes per parameter."),
) -> None:
    """Per-task step breakdown (compute, communication, input, idle), the verdict, and the files.

    Example: tensorfleet profile report profile/ --params 4.7M --bandwidth 0.33GB/s --latency 1290us
    """
    from tensorfleet.io import check_writable
    from tensorfleet.profiling.breakdown import analyze
    from tensorfleet.profiling.report import REPORT_FILES, format_table, write_report

    if (params is None) != (bandwidth is None):
        raise ValueError("--params and --bandwidth go together: the planner needs the model and the link. "
                         f"Received: --params={params!r}, --bandwidth={bandwidth!r}")
    target = out_dir if out_dir is not None else source
    if source.is_dir():
        check_writable(target / REPORT_FILES["json"])
    profile = analyze(source, skip_first=skip_first)
    check = None if params is None or bandwidth is None else _planner_check(profile, params, bandwidth, latency,
                                                                             algorithm, bytes_per_param)
    extra = {} if check is None else {"planner": {**asdict(check), "error": check.error}}
    paths = write_report(profile, target, extra=extra)
    if as_json:
        typer.echo(json.dumps({**profile.as_dict(), **extra}, indent=2))
        return
    typer.echo(format_table(profile))
    if check is not None:
        typer.echo(f"communication per step: measured {check.measured_ms:.1f} ms ({check.measured_share:.0%} of the "
                   f"{check.step_ms:.1f} ms step); planner ({check.algorithm}, {check.workers} workers, "
                   f"{check.gradient_bytes / 1e6:.2f} MB) {check.predicted_ms:.1f} ms; error {check.error:+.0%}")
    typer.echo("")
    typer.echo(f"wrote {paths['json']}, {paths['png']} and {paths['trace']} (open it in ui.perfetto.dev); "
               f"TensorBoard: tensorboard --logdir {source}")


def _planner_check(profile: Any, params: str, bandwidth: str, latency: str,
                   algorithm: AllReduceAlgorithm | None,
                   bytes_per_param: int) -> Any:
    from tensorfleet.planner.cost_model import Link
    from tensorfleet.profiling.breakdown import TaskRole
    from tensorfleet.profiling.planned import compare
    from tensorfleet.validation import parse_count, positive_int

    count = parse_count(params)
    link = Link.from_strings(latency=latency, bandwidth=bandwidth)
    per_param = positive_int("--bytes-per-param", bytes_per_param)
    roles = [t.role for t in profile.tasks]
    workers = sum(role in (TaskRole.TRAINER, TaskRole.WORKER) for role in roles)
    default = "ps" if TaskRole.WORKER in roles else "ring"
    return compare(profile, gradient_bytes=count * per_param, workers=workers, link=link,
                   algorithm=algorithm.value if algorithm is not None else default)
