"""``tensorfleet serve``: a model's base directory over TF Serving's gRPC and REST APIs.

The flags are TF Serving's where it has them (``--port`` 8500 for gRPC, ``--rest-api-port``
8501, ``--model-name``, ``--enable-batching`` with ``--max-batch-size``, ``--batch-timeout-micros``,
``--num-batch-threads``); TF Serving's underscore spellings are accepted too. Both fronts bind
127.0.0.1 unless ``--host`` says otherwise. SIGTERM or Ctrl-C drains the requests in flight, then exits.

Example:
    $ tensorfleet serve models/digits --model-name digits --enable-batching --max-batch-size 32
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from tensorfleet.serving.batching import BatchingPolicy
from tensorfleet.serving.repository import VersionPolicy

__all__ = ["register", "serve_command"]


def _labels(pairs: list[str]) -> dict[str, int]:
    labels = {}
    for pair in pairs:
        label, sep, version = pair.partition("=")
        if not sep or not label or not version.isdigit():
            raise ValueError(f"--label takes LABEL=VERSION (e.g. stable=1). Received: --label {pair!r}")
        labels[label] = int(version)
    return labels


def _sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--allowed-batch-sizes takes comma-separated integers. Received: {text!r}") from None


def _devices(text: str | None) -> list[str] | None:
    if text is None:
        return None
    devices = [d.strip() for d in text.split(",")]
    if not all(devices):
        raise ValueError(f"--stage-devices takes comma-separated device names, e.g. /cpu:0,/cpu:1. Received: {text!r}")
    return devices


def _threads(intra_op: int, inter_op: int) -> None:
    """TensorFlow's thread pools for this process; set before its runtime starts, as TF Serving does."""
    if intra_op or inter_op:
        import tensorflow as tf

        if intra_op:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        if inter_op:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op)


def serve_command(
    base: Optional[Path] = typer.Argument(  # noqa: UP007
        None, help="The model's base directory (BASE/<version>/saved_model.pb); or --model-config-file."),
    model_config_file: Optional[Path] = typer.Option(  # noqa: UP007
        None, "--model-config-file", "--model_config_file", help="TF Serving's text-format ModelServerConfig: "
        "several models, each with its base_path, model_version_policy and version_labels (instead of BASE)."),
    model_name: Optional[str] = typer.Option(  # noqa: UP007
        None, "--model-name", "--model_name", help="The name clients ask for (default: BASE's name)."),
    port: int = typer.Option(8500, "--port", help="gRPC port."),
    rest_api_port: int = typer.Option(8501, "--rest-api-port", "--rest_api_port", help="REST port; 0 turns REST off."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; 0.0.0.0 serves every interface."),
    enable_batching: bool = typer.Option(False, "--enable-batching", "--enable_batching",
                                         help="Run concurrent requests as one batch."),
    max_batch_size: int = typer.Option(32, "--max-batch-size", "--max_batch_size", help="Rows per batch at most."),
    batch_timeout_micros: int = typer.Option(1000, "--batch-timeout-micros", "--batch_timeout_micros",
                                             help="How long a batch waits to fill."),
    num_batch_threads: int = typer.Option(2, "--num-batch-threads", "--num_batch_threads",
                                          help="Batches run at once."),
    batching_policy: BatchingPolicy = typer.Option(
        BatchingPolicy.ADAPTIVE, "--batching-policy", help="adaptive: a lone request goes at once; under load a "
        "batch waits for the requests on their way (at most --batch-timeout-micros); timeout: the first request of a "
        "batch waits --batch-timeout-micros for others (TF Serving's)."),
    allowed_batch_sizes: Optional[str] = typer.Option(  # noqa: UP007
        None, "--allowed-batch-sizes", help="Sizes batches are padded to, e.g. 2,8,32 (default: powers of 2)."),
    model_version_policy: VersionPolicy = typer.Option(
        VersionPolicy.LATEST, "--model-version-policy", help="latest (the highest version) or all (specific: in a "
        "--model-config-file)."),
    label: Optional[List[str]] = typer.Option(  # noqa: UP006,UP007
        None, "--label", help="A version label, LABEL=VERSION (repeatable)."),
    max_request_size: str = typer.Option("4MiB", "--max-request-size",
                                         help="Largest request body or gRPC message (e.g. 4MiB)."),
    drain_seconds: float = typer.Option(10.0, "--drain-seconds", help="How long SIGTERM waits for requests in flight."),
    poll_seconds: float = typer.Option(1.0, "--file-system-poll-wait-seconds", "--file_system_poll_wait_seconds",
                                       help="How often BASE is checked for new versions (0: never)."),
    stages: int = typer.Option(1, "--stages", help="Serve stage to stage through the model's stage_* signatures "
                               "(export with `serving export --stages K`)."),
    micro_batches: int = typer.Option(4, "--micro-batches", help="With --stages: micro-batches per request in flight."),
    stage_devices: Optional[str] = typer.Option(  # noqa: UP007
        None, "--stage-devices", help="With --stages K: K comma-separated devices, one per stage, e.g. "
        "/cpu:0,/cpu:1 (logical CPUs are made as needed) or /gpu:0,/gpu:1."),
    intra_op: int = typer.Option(0, "--tensorflow-intra-op-parallelism", "--tensorflow_intra_op_parallelism",
                                 help="Threads one TensorFlow op may use (0: TensorFlow's choice)."),
    inter_op: int = typer.Option(0, "--tensorflow-inter-op-parallelism", "--tensorflow_inter_op_parallelism",
                                 help="TensorFlow ops run at once (0: TensorFlow's choice)."),
    replicas: int = typer.Option(0, "--replicas", help="Model replicas in worker processes (0: in the server's "
                                 "process); a dead replica is restarted and its requests retried."),
    min_replicas: Optional[int] = typer.Option(None, "--min-replicas",  # noqa: UP007
                                               help="Elastic: the fewest replicas (with --max-replicas); 0 scales "
                                                    "to zero after --idle-timeout."),
    max_replicas: Optional[int] = typer.Option(None, "--max-replicas",  # noqa: UP007
                                               help="Elastic: replicas are added up to this many while requests "
                                                    "queue longer than --scale-target-ms, removed when idle."),
    scale_target_ms: float = typer.Option(10.0, "--scale-target-ms", help="Elastic: the queue latency target."),
    idle_timeout: float = typer.Option(60.0, "--idle-timeout", help="With --min-replicas 0: seconds without a "
                                       "request before the last replica stops (the next request starts one)."),
    scale_plot: Optional[str] = typer.Option(None, "--scale-plot",  # noqa: UP007
                                             help="Elastic: a PNG of the replica count and scale events at exit."),
) -> None:
    """Serve BASE (or a --model-config-file's models) over TF Serving's gRPC and REST APIs until SIGTERM."""
    from tensorfleet.io import existing_folder
    from tensorfleet.serving.batching import BatchingOptions
    from tensorfleet.serving.options import FrontOptions, ScalingOptions, StageOptions, VersionOptions
    from tensorfleet.serving.server import serve
    from tensorfleet.validation import integer, parse_bytes

    if (base is None) == (model_config_file is None):
        raise ValueError(f"Serve BASE or --model-config-file, one of the two. Received: BASE={base}, "
                         f"--model-config-file={model_config_file}")
    if base is not None:
        existing_folder(base, "a model base directory (BASE/<version>/saved_model.pb)")
    if (min_replicas is None) != (max_replicas is None):
        raise ValueError("--min-replicas and --max-replicas go together (elastic serving). "
                         f"Received: --min-replicas={min_replicas}, --max-replicas={max_replicas}")
    if min_replicas is not None:
        integer("--min-replicas", min_replicas, minimum=0)
        integer("--max-replicas", max_replicas, minimum=max(min_replicas, 1))
    _threads(integer("--tensorflow-intra-op-parallelism", intra_op, minimum=0),
             integer("--tensorflow-inter-op-parallelism", inter_op, minimum=0))
    batching = BatchingOptions(max_batch_size=max_batch_size, batch_timeout_micros=batch_timeout_micros,
                               num_batch_threads=num_batch_threads, policy=batching_policy,
                               allowed_batch_sizes=_sizes(allowed_batch_sizes)) if enable_batching else None
    scaling = ScalingOptions(replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas,
                             target_ms=scale_target_ms, idle_timeout=idle_timeout, plot=scale_plot)
    devices = _devices(stage_devices)
    # The server's event loop and the threads running the model share the interpreter lock; with
    # Python's default 5 ms switch interval a request can wait that long for it after a signature
    # call. 0.5 ms measured 1.5x to 1.7x the requests/s with batching at concurrency 32 on a 2-core
    # machine, at the same CPU time per request.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        serve(base, model_config_file=model_config_file, model_name=model_name, host=host, port=port,
              rest_api_port=rest_api_port, batching=batching,
              versions=VersionOptions(policy=model_version_policy, labels=_labels(label or [])),
              front=FrontOptions(max_request_bytes=int(parse_bytes(max_request_size)), drain_seconds=drain_seconds),
              scaling=scaling, stages=StageOptions(stages, micro_batches, tuple(devices) if devices else None),
              poll_seconds=poll_seconds, log=lambda line: typer.echo(f"[serve] {line}"))
    except FileNotFoundError:
        raise
    except OSError as exc:  # a port already taken, an address that cannot be bound: one line, not a traceback
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        sys.setswitchinterval(previous)


def register(app: typer.Typer) -> None:
    """Adds ``serve`` to the ``tensorfleet`` command."""
    app.command("serve")(serve_command)
