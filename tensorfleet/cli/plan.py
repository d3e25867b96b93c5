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
    model: Optional[str] = typer.Option(None, "--model", help="A registered model name (tensorfleet models)."),  # noqa: UP007
    params: Optional[str] = typer.Option(  # noqa: UP007
        None, "--params", help="A transformer's parameter count instead of --model: 1.5B, 350M, 175e9."),
    transformer: Optional[str] = typer.Option(  # noqa: UP007
        None, "--transformer", help="A known transformer instead of --model: gpt2, gpt2-medium, gpt2-large, "
        "gpt2-xl, gpt3-175b, bert-base, bert-large."),
    batch: int = typer.Option(..., "--batch", help="Global batch size (sequences for a transformer)."),
    devices: int = typer.Option(..., "--devices", help="Devices in all, spread evenly over --nodes."),
    device_memory: str = typer.Option(..., "--device-memory", help="Memory of one device, with a unit: 16GB, 512MiB."),
    bandwidth: str = typer.Option(..., "--bandwidth", help="Network bandwidth, with a unit: 100Gbps, 25Gbit/s, 10GB/s."),
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
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
    output: Optional[Path] = typer.Option(None, "--output", help="Also write the plan as JSON to this file."),  # noqa: UP007
) -> None:
    """Memory per device and time per step of every strategy, and a recommendation.

    Example: tensorfleet plan --transformer gpt2-xl --batch 32 --devices 8 --device-memory 16GB --bandwidth 100Gbps
    """
    from tensorfleet.io import write_json
    from tensorfleet.planner import plans as planner
    from tensorfleet.validation import parse_count

    result = planner.plan(
        model, parameters=None if params is None else parse_count(params), transformer=transformer,
        shape=planner.ModelShape(seq_len=seq_len, layers=layers, hidden=hidden, heads=heads),
        batch_size=batch, devices=devices, device_memory=device_memory, bandwidth=bandwidth,
        device_tflops=device_tflops,
        network=planner.Network(nodes=nodes, intra_bandwidth=intra_bandwidth, latency=latency),
        training=planner.TrainingOptions(optimizer=optimizer.value, precision=precision.value, zero=zero),
        servers=planner.ParameterServers(count=ps_servers, memory=server_memory),
    )
    if output is not None:
        write_json(output, result.as_dict())
    typer.echo(json.dumps(result.as_dict(), indent=2) if as_json else result.table())


def register(app: typer.Typer) -> None:
    """Adds ``plan`` to the ``tensorfleet`` command."""
    app.command(NAME, help="Which parallel strategy fits a model on a cluster, and which is fastest.")(plan_command)
