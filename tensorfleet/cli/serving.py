"""``tensorfleet serving``: models into TF Serving's versioned layout.

Example:
    $ tensorfleet serving export digits.keras models/digits --version 1
    $ tensorfleet serve models/digits          # the server: see tensorfleet.cli.serve
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

__all__ = ["NAME", "app"]

NAME = "serving"
app = typer.Typer(name=NAME, help="Export models for `tensorfleet serve` (and TF Serving).", no_args_is_help=True)


@app.command("export")
def export_cmd(
    model: Path = typer.Argument(..., help="A saved Keras model: a .keras or .h5 file (Keras 3 or tf_keras, "
                               "read by the Keras that wrote it), or a tf_keras SavedModel directory."),
    base: Path = typer.Argument(..., help="The model's base directory; the version goes to BASE/<version>/."),
    version: int = typer.Option(1, "--version", "-v", help="The version number (a positive integer)."),
    input_names: Optional[List[str]] = typer.Option(  # noqa: UP006,UP007
        None, "--input-name", help="The signature's input name(s), in the model's order (default: its layer names)."),
    output_names: Optional[List[str]] = typer.Option(  # noqa: UP006,UP007
        None, "--output-name", help="The signature's output name(s) (default: the output layer names)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing version directory."),
    stages: int = typer.Option(1, "--stages", help="Also save the model cut into this many stage signatures "
                               "(stage_0 ...) for `tensorfleet serve --stages`."),
) -> None:
    """Write MODEL as a SavedModel with a serving_default signature to BASE/<version>/, and print its names."""
    from tensorfleet.serving.saved_model import export, load_keras_model
    from tensorfleet.validation import positive_int

    positive_int("--version", version)  # before loading anything
    result = export(load_keras_model(model), base, version, input_names=input_names or None,
                    output_names=output_names or None, overwrite=overwrite, stages=stages)
    typer.echo(result.summary())
