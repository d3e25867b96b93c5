"""``tensorfleet edge``: convert, validate, report and export models for microcontrollers.

Example:
    tensorfleet edge convert ds_cnn --quantization int8 --out kws.tflite
    tensorfleet edge report kws.tflite --target nano33ble --json kws.json --plot kws.png
    tensorfleet edge export kws.tflite --name kws --out firmware/
    tensorfleet edge decompose model.keras --method tucker2 --energy 0.9 --out small.keras --plot plan.png
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, Optional

import typer

from tensorfleet.edge.decompose_plan import DecompositionMethod

__all__ = ["NAME", "app", "calibration_data", "parse_rank"]

NAME = "edge"
app = typer.Typer(help="TFLite conversion, TFLite Micro validation, size report and C export.",
                  no_args_is_help=True)

_PROGRESS_HELP = "Progress bars on stderr (calibration, arena search, TFLM runs); default: when stderr is a terminal."


def _progress(flag: bool | None) -> bool:
    """``--progress/--no-progress``, else bars only for a terminal: a log file or a pipe gets no bar redrawn."""
    return sys.stderr.isatty() if flag is None else flag


def calibration_data(model_name: str, num_samples: int) -> Any:
    """Offline representative data for a ``tensorfleet.models`` name (digits or generated TinyML data)."""
    from tensorfleet import models
    from tensorfleet.models import tinyml

    canonical = models.MODELS.canonical(model_name)
    if canonical in tinyml.REFERENCE:
        return tinyml.synthetic(canonical, n=num_samples).x
    if canonical.startswith("digits"):
        split = models.datasets.load_digits(flat=canonical == "digits_mlp")
        return split.x_train[:num_samples]
    raise ValueError(f"No built-in calibration data for model {model_name!r}; pass --data FILE.npy.")


def _load_npy(path: Path) -> Any:
    """The array of a ``.npy`` file (``--data``); one clear error naming the file for anything else."""
    import numpy as np

    from tensorfleet.io import UnreadableFileError, existing_file

    expected = "a .npy array file (numpy.save)"
    existing_file(path, expected)
    with open(path, "rb") as handle:
        head = handle.read(6)
    if head != b"\x93NUMPY":  # numpy would try to unpickle it, or open a zip as an .npz, and say neither
        raise UnreadableFileError(f"--data {str(path)!r} is not a .npy file: it starts with {head!r} "
                                  f"({path.stat().st_size:,} bytes); expected {expected}.")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError) as exc:  # EOFError: truncated (click would call it Ctrl-D)
        raise UnreadableFileError(f"--data {str(path)!r} is a damaged .npy file ({type(exc).__name__}: {exc}); "
                                  f"expected {expected}.") from None


@app.command("convert")
def convert_cmd(
    model: str = typer.Argument(..., help="A tensorfleet.models name (e.g. ds_cnn) or a saved Keras model: a path "
                                "that exists, or any name ending in .keras/.h5 or holding a '/', is a path."),
    quantization: str = typer.Option("int8", "--quantization", "-q",
                                     help="float32, dynamic, float16, int8 or int16x8."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Where to write the .tflite file."),
    data: Optional[Path] = typer.Option(None, "--data", help="Representative samples as a .npy array."),  # noqa: UP007
    samples: int = typer.Option(100, "--samples", help="Calibration samples to use."),
    metadata: Optional[Path] = typer.Option(None, "--metadata", help="Also write the metadata as JSON."),  # noqa: UP007
    per_channel_dense: bool = typer.Option(
        False, "--per-channel-dense",
        help="int8/int16x8: one scale per output unit for dense weights (more TFLM arena; TF >= 2.16)."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help=_PROGRESS_HELP),  # noqa: UP007
) -> None:
    """Convert MODEL to TFLite with one quantization mode and write it to --out."""
    from tensorfleet import edge, models
    from tensorfleet.io import check_writable, write_json

    mode = edge.QUANTIZATIONS.canonical(quantization)  # fail on a bad mode or destination before converting
    if samples < 1:
        raise ValueError(f"--samples takes the number of calibration samples, at least 1. "
                         f"Received: --samples {samples}")
    if per_channel_dense and not edge.QUANTIZATIONS.get(mode).needs_representative_data:
        raise ValueError(f"--per-channel-dense applies to int8 and int16x8. Received: --quantization {mode}")
    for destination in (out_path, metadata):
        if destination is not None:
            check_writable(destination)
    # The model first (a file in the Keras that wrote it): a name that is neither a file nor a zoo model says so,
    # before anything asks for calibration data it would not use.
    keras_model = edge.load_keras_model(model)
    rep = None
    if edge.QUANTIZATIONS.get(mode).needs_representative_data:
        if data is not None:
            rep = _samples_for(keras_model, data)
        elif models.model_file(model) is not None:  # a saved model: no built-in calibration data
            raise ValueError(f"--quantization {mode} needs --data FILE.npy with samples for a saved model.")
        else:
            rep = calibration_data(model, samples)
    # an EdgeWarning (dynamic that quantized nothing) is a `warning:` line: cli.main.warnings_shown
    artifact = edge.convert(keras_model, mode, rep, num_calibration_samples=samples,
                            per_channel_dense=per_channel_dense, progress=_progress(progress))
    artifact.save(out_path)
    if metadata is not None:
        write_json(metadata, artifact.metadata())
    inp, outp = artifact.inputs[0], artifact.outputs[0]
    typer.echo(f"wrote {out_path} ({artifact.size:,} bytes, {artifact.quantization}); input {inp.dtype} "
               f"{list(inp.shape)}, output {outp.dtype} {list(outp.shape)}; ops: {', '.join(artifact.op_types)}")


def _samples_for(keras_model: Any, data: Path) -> Any:
    """``--data``'s samples, refused in the flag's words unless shaped like the model's input."""
    from tensorfleet.edge.convert import check_samples_shape

    rep = _load_npy(data)
    check_samples_shape(rep.shape, keras_model.input_shape,
                        f"--data {str(data)!r} must hold samples shaped like the model's input, an array of shape "
                        "{shape}.")
    return rep


@app.command("validate")
def validate_cmd(
    model: Path = typer.Argument(..., help="A .tflite file."),
    arena_bytes: Optional[int] = typer.Option(None, "--arena-bytes",  # noqa: UP007
                                              help="The target's arena in bytes (at most 64 MiB)."),
    data: Optional[Path] = typer.Option(None, "--data",  # noqa: UP007
                                        help="Samples (.npy) to run on TFLM and the desktop TFLite interpreter."),
    arena_size: Optional[int] = typer.Option(None, "--arena-size", hidden=True,  # noqa: UP007
                                             help="The older name of --arena-bytes (until the next release)."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help=_PROGRESS_HELP),  # noqa: UP007
) -> None:
    """Check that TFLite Micro runs the model: ops, smallest arena, agreement with desktop TFLite (LiteRT)."""
    from tensorfleet import edge
    from tensorfleet.validation import take_renamed

    if arena_size is not None:
        # Shown as a `warning:` line by the CLI's entry point (cli.main.warnings_shown), in the command
        # line's words; take_renamed's own warning (in Python's words) would say it a second time.
        warnings.warn("--arena-size is now --arena-bytes; the older flag will stop working in the next release.",
                      DeprecationWarning, stacklevel=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            arena_bytes = take_renamed({"arena_size": arena_size, "arena_bytes": arena_bytes}, "arena_size",
                                       "arena_bytes", "tensorfleet edge validate")["arena_bytes"]
    artifact = edge.TFLiteArtifact.from_file(model)
    result = edge.validate_micro(artifact, None if data is None else _load_npy(data), arena_bytes=arena_bytes,
                                 progress=_progress(progress))
    typer.echo(f"TFLite Micro runs {model} ({artifact.quantization}, {artifact.size:,} bytes); smallest arena "
               f"{result.arena_bytes:,} bytes for the {result.arena_allocator} - a safe size for a firmware, "
               f"whose plain MicroAllocator needs 240-424 bytes less")
    if result.bit_identical is not None:
        typer.echo(result.tflite_agreement())


@app.command("report")
def report_cmd(
    model: Path = typer.Argument(..., help="A .tflite file."),
    target: Optional[str] = typer.Option(None, "--target", "-t",  # noqa: UP007
                                         help="A board (see `edge boards`) or 'flash=1M,ram=256K'."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON."),  # noqa: UP007
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG plot of the per-layer costs."),  # noqa: UP007
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help=_PROGRESS_HELP),  # noqa: UP007
) -> None:
    """Flash, RAM (TFLM arena), per-layer parameters, MACs and activations; whether it fits --target."""
    from tensorfleet import edge
    from tensorfleet.io import check_writable

    for destination in (json_path, plot):
        if destination is not None:
            check_writable(destination)
    artifact = edge.TFLiteArtifact.from_file(model)
    rep = edge.report(artifact, target=target, progress=_progress(progress))
    typer.echo(rep.table())
    if json_path is not None:
        typer.echo(f"wrote {rep.save_json(json_path)}")
    if plot is not None:
        typer.echo(f"wrote {rep.plot(plot)}")
    if rep.fit is not None and not rep.fit.fits:
        raise typer.Exit(code=1)


@app.command("export")
def export_cmd(
    model: Path = typer.Argument(..., help="A .tflite file."),
    name: str = typer.Option(..., "--name", "-n", help="Base name of the C files and symbols: letters, digits and "
                                                      "single underscores, starting with a letter."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Directory for the C sources."),
    arena: bool = typer.Option(True, "--arena/--no-arena", help="Measure the arena and declare it in the header."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help=_PROGRESS_HELP),  # noqa: UP007
) -> None:
    """Write <name>_model_data.cc/.h and <name>_op_resolver.h for a TFLite Micro build."""
    from tensorfleet import edge
    from tensorfleet.io import check_writable

    check_writable(out_dir / f"{edge.check_c_name(name)}_model_data.h")  # before the arena search
    artifact = edge.TFLiteArtifact.from_file(model)
    arena_bytes = edge.find_arena_size(artifact, progress=_progress(progress)) if arena else None
    for path in edge.export_c(artifact, out_dir, name, arena_bytes=arena_bytes):
        typer.echo(f"wrote {path}")


@app.command("boards")
def boards_cmd() -> None:
    """The boards --target knows, with flash and RAM."""
    from tensorfleet.edge import BOARDS

    for entry in BOARDS.entries():
        board = entry.obj
        aliases = f" ({', '.join(entry.aliases)})" if entry.aliases else ""
        typer.echo(f"{board.name}{aliases}: flash {board.flash_bytes:,} B, RAM {board.ram_bytes:,} B - "
                   f"{entry.description}")


@app.command("modes")
def modes_cmd() -> None:
    """The quantization modes, and which of them TFLite Micro can run."""
    from tensorfleet.edge import QUANTIZATIONS

    for entry in QUANTIZATIONS.entries():
        micro = "TFLM: yes" if entry.obj.micro_compatible else "TFLM: no"
        typer.echo(f"{entry.name:<8} {micro:<9} {entry.description}")


def parse_rank(text: str | None) -> Any:
    """``--rank``: an integer, ``IN,OUT`` (tucker2's channel ranks) or ``vbmf``."""
    from tensorfleet.edge import DecompositionError

    if text is None or text.strip().lower() == "vbmf":
        return None if text is None else "vbmf"
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts) or len(parts) > 2:
        raise DecompositionError(f"--rank must be an integer, IN,OUT (tucker2) or vbmf. Received: --rank {text!r}")
    return int(parts[0]) if len(parts) == 1 else (int(parts[0]), int(parts[1]))


@app.command("decompose")
def decompose_cmd(
    model: Path = typer.Argument(..., help="A saved Keras model (.keras or .h5)."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Where to write the decomposed model (.keras)."),
    method: DecompositionMethod = typer.Option(DecompositionMethod.TUCKER2, "--method", "-m",
                                               help="How Conv2D layers are factored (Dense layers: svd)."),
    rank: Optional[str] = typer.Option(None, "--rank", help="An integer, IN,OUT for tucker2, or vbmf."),  # noqa: UP007
    energy: Optional[float] = typer.Option(None, "--energy",
                                           help="Share of each kernel's energy to keep, in (0, 1]."),  # noqa: UP007
    plot: Optional[Path] = typer.Option(None, "--plot",
                                        help="Write a PNG of parameters and FLOPs per layer."),  # noqa: UP007
) -> None:
    """Replace Dense and Conv2D layers by low-rank factors; print the plan as a table first."""
    from tensorfleet import edge
    from tensorfleet.edge.decompose import save_keras
    from tensorfleet.io import check_writable, existing_file

    chosen_rank = parse_rank(rank)
    if out_path.suffix != ".keras":
        raise edge.DecompositionError(f"--out must name a .keras file. Received: --out {str(out_path)!r}")
    for destination in (out_path, plot):
        if destination is not None:
            check_writable(destination)
    keras_model = edge.load_keras_model(existing_file(model, "a saved Keras model (.keras or .h5)"))
    plan = edge.plan_decomposition(keras_model, method, rank=chosen_rank, energy=energy)
    typer.echo(plan.describe())
    small = edge.decompose(keras_model, plan=plan)
    if plot is not None:
        typer.echo(f"wrote {plan.plot(plot)}")
    typer.echo(f"wrote {save_keras(small, out_path)} ({small.count_params():,} parameters, "
               f"{keras_model.count_params():,} before)")
