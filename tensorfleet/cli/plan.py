"""``tensorfleet plan``: which parallel strategy fits a model on a cluster, and which is fastest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tensorfleet.planner.memory import Optimizer
from tensorfleet.strategies.memory_savers import Precision

__all__ = ["NAME", "register", "plan_command"]

NAME = "plan"


def plan_command(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model",
                                        help="A registered model name (tensorfleet models)."),  # noqa: UP007
    params: Optional[str] = typer.Option(  # noqa: UP007
        None, "--params", help="A transformer's parameter count instead of --model: 1.5B, 350M, 175e9."),
    transformer: Optional[str] = typer.Option(  # noqa: UP007
        None, "--transformer", help="A known transformer instead of --model: gpt2, gpt2-medium, gpt2-large, "
        "gpt2-xl, gpt3-175b, bert-base, bert-large."),
    batch: int = typer.Option(..., "--batch", help="Global batch size (sequences for a transformer)."),
    devices: int = typer.Option(..., "--devices", help="Devices in all, spread evenly over --nodes."),
    device_memory: str = typer.Option(..., "--device-memory", help="Memory of one device, with a unit: 16GB, 512MiB."),
    bandwidth: str = typer.Option(..., "--bandwidth",
                                  help="Network bandwidth, with a unit: 100Gbps, 25Gbit/s, 10GB/s."),
    nodes: int = typer.Option(1, "--nodes", help="Machines; with more than one, --bandwidth is between them."),
    intra_bandwidth: Optional[str] = typer.Option(  # noqa: UP007
        None, "--intra-bandwidth", help="Links inside a machine (default --bandwidth)."),
    latency: str = typer.Option("5us", "--latency", help="Per-message latency: 5us, 1ms."),
    device_tflops: float = typer.Option(100.0, "--device-tflops", help="Sustained TFLOP/s of one device."),
    optimizer: Optimizer = typer.Option(Optimizer.ADAM, "--optimizer", help="The optimizer, by the state it keeps."),
    precision: Precision = typer.Option(Precision.MIXED_FLOAT16, "--precision", help="Float32, or mixed precision."),
    seq_len: Optional[int] = typer.Option(  # noqa: UP007
        None, "--seq-len", help="Sequence length (default: --transformer's, or 1024 with --params)."),
    layers: Optional[int] = typer.Option(None, "--layers", help="Transformer layers (--params)."),  # noqa: UP007
    hidden: Optional[int] = typer.Option(  # noqa: UP007
        None, "--hidden", help="Transformer hidden size (--params, with --heads)."),
    heads: Optional[int] = typer.Option(  # noqa: UP007
        None, "--heads", help="Attention heads (--params, with --hidden)."),
    ps_servers: int = typer.Option(1, "--ps-servers", help="Parameter servers of the data_ps layout."),
    server_memory: Optional[str] = typer.Option(  # noqa: UP007
        None, "--server-memory", help="Memory of one parameter server (default --device-memory): 256GB."),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0-3 over the data-parallel replicas: 1 shards the "
                             "optimizer state, 2 also the gradients, 3 also the parameters."),
    compression: Optional[str] = typer.Option(  # noqa: UP007
        None, "--compression", help="The gradients' all-reduce compressed: fp16, bf16, powersgd:rank=2."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
    out_path: Optional[Path] = typer.Option(None, "--output",
                                            help="Also write the plan as JSON to this file."),  # noqa: UP007
    run: Optional[Path] = typer.Option(  # noqa: UP007
        None, "--run", help="Run this script under the recommended layout as a mesh (its "
        "tfl.planner.planned_mesh()), then print the plan's memory and step time beside the run's; arguments "
        "after -- reach the script."),
    run_strategy: Optional[str] = typer.Option(  # noqa: UP007
        None, "--run-strategy", help="With --run: run this row of the plan instead of the recommendation "
        "(data_allreduce, tensor, hybrid with p=1)."),
    report: Path = typer.Option(Path("plan_report.json"), "--report",
                                help="With --run: where the comparison is written as JSON (and beside it as PNG)."),
    run_timeout: Optional[float] = typer.Option(  # noqa: UP007
        None, "--run-timeout", help="With --run: seconds the script may take."),
    run_processes: Optional[int] = typer.Option(  # noqa: UP007
        None, "--run-processes", help="With --run: the processes the mesh spans (tensorfleet launch --mesh "
        "workers on 127.0.0.1), each with its share of --devices; default 1."),
) -> None:
    """Memory per device and time per step of every strategy, and a recommendation.

    Example: tensorfleet plan --transformer gpt2-xl --batch 32 --devices 8 --device-memory 16GB --bandwidth 100Gbps

    With --run script.py: the script runs in a process of its own on the plan's devices (logical CPUs here),
    its tfl.planner.planned_mesh() the recommended layout; see docs/how-to-run-the-plan.md.
    """
    from tensorfleet.io import write_json
    from tensorfleet.planner import plans as planner
    from tensorfleet.validation import parse_count

    _check_run_options(run, {"--run-strategy": run_strategy, "--run-timeout": run_timeout,
                             "--run-processes": run_processes,
                             "--report": None if report == Path("plan_report.json") else report}, ctx.args)
    result = planner.plan(
        model, parameters=None if params is None else parse_count(params), transformer=transformer,
        shape=planner.ModelShape(seq_len=seq_len, layers=layers, hidden=hidden, heads=heads),
        batch_size=batch, devices=devices, device_memory=device_memory, bandwidth=bandwidth,
        device_tflops=device_tflops,
        network=planner.Network(nodes=nodes, intra_bandwidth=intra_bandwidth, latency=latency),
        training=planner.TrainingOptions(optimizer=optimizer.value, precision=precision.value, zero=zero,
                                         compression=compression),
        servers=planner.ParameterServers(count=ps_servers, memory=server_memory),
    )
    if run is not None:  # a row the mesh cannot run is refused before the table
        from tensorfleet.planner.runs import mesh_spec

        mesh_spec(result.row(run_strategy or result.recommendation))
    if out_path is not None:
        write_json(out_path, result.as_dict())
    typer.echo(json.dumps(result.as_dict(), indent=2) if as_json else result.table())
    if run is not None:
        from tensorfleet.planner.runs import ScriptFailedError

        try:
            ran = result.run(run, ctx.args, strategy=run_strategy, report=report, timeout=run_timeout,
                             processes=1 if run_processes is None else run_processes)
        except ScriptFailedError as exc:  # the script's own error: its traceback is above, not tensorfleet's bug
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.returncode) from None
        typer.echo(ran.table())
        typer.echo(f"report: {report} and {report.with_suffix('.png')}")


def _check_run_options(run: Path | None, given: dict[str, object], extra: list[str]) -> None:
    """Options of --run given without it, and stray arguments, are refused."""
    if run is not None:
        return
    refused = [name for name, value in given.items() if value is not None]
    if refused:
        raise ValueError(f"{', '.join(refused)} appl{'ies' if len(refused) == 1 else 'y'} to --run only. Received: "
                         + ", ".join(f"{name}={given[name]}" for name in refused) + " and no --run")
    if extra:
        raise ValueError(f"Arguments after the options reach a --run script only. Received: {' '.join(extra)!r} and "
                         "no --run")


def register(app: typer.Typer) -> None:
    """Adds ``plan`` to the ``tensorfleet`` command."""
    app.command(NAME, help="Which parallel strategy fits a model on a cluster, and which is fastest; --run runs a "
                "script under it.", context_settings={"allow_extra_args": True})(
        plan_command)
