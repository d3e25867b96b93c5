"""A Keras model as a SavedModel in TF Serving's versioned layout (``BASE/<version>/``).

TF Serving loads ``BASE/<version>/saved_model.pb`` and serves its ``serving_default`` signature; a
directory whose name is not an integer is ignored. The version is written under a temporary name
in ``BASE`` and renamed into place when complete, so a server polling ``BASE`` never sees half a
model.

Only the model's variables and one ``tf.function`` are saved (not Keras' own per-layer traces), so
export is quick, and a model built under any ``tf.distribute`` strategy scope exports the same way:
its mirrored variables are saved once, as plain variables.

A Keras 3 model and a tf_keras model export the same way, to the same signature: the inputs and
outputs are named after their layers, with the model's dtypes and a batch dimension of any size.
(Keras 3's own ``model.export(format="tf_saved_model")`` would name them ``keras_tensor``/``output_0``
instead; TF Serving runs either, but a client of a version should not have to know which Keras wrote it.)
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tensorfleet.compat.keras import Keras, KerasFileError, keras_of, producing_layer_name
from tensorfleet.validation import integer, renamed

__all__ = ["DEFAULT_SIGNATURE", "BaseNotAFolderError", "ExportResult", "TensorSignature", "VersionExistsError",
           "export", "load_keras_model"]


class VersionExistsError(FileExistsError, ValueError):
    """The version to export is already in the base directory (and ``overwrite`` was not asked for). A
    ``ValueError`` too, so the command line reports it as bad input in one line."""


class BaseNotAFolderError(NotADirectoryError, ValueError):
    """The model's base directory is a file."""

DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class TensorSignature:
    """One named input or output of a signature: its dtype name and shape (``None`` = any size)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def __str__(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export` wrote: the version directory and the signature's named tensors."""

    path: Path
    version: int
    signature_name: str
    inputs: tuple[TensorSignature, ...] = field(default_factory=tuple)
    outputs: tuple[TensorSignature, ...] = field(default_factory=tuple)
    stages: tuple[str, ...] = ()

    def summary(self) -> str:
        """Lines stating where the model went and the names a client must use."""
        lines = [f"exported version {self.version} to {self.path} (signature {self.signature_name!r})"]
        lines += [f"  input  {t}" for t in self.inputs]
        lines += [f"  output {t}" for t in self.outputs]
        if self.stages:
            lines.append(f"  stages {', '.join(self.stages)} (for `tensorfleet serve --stages {len(self.stages)}`)")
        return "\n".join(lines)


def _unique(names: Sequence[str], what: str) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError(f"{what} must be distinct. Received: {what}={list(names)!r}")
    return list(names)


def _names(given: Sequence[str] | None, default: Sequence[str], what: str) -> list[str]:
    if given is None:
        return _unique(default, what)
    given = [given] if isinstance(given, str) else list(given)
    if len(given) != len(default):
        raise ValueError(f"{what} must name each of the model's {len(default)} tensors. "
                         f"Received: {what}={given!r}")
    return _unique(given, what)


def _layer_names(model: Any) -> tuple[list[str], list[str]]:
    """The default signature names: the layers that make the model's inputs and outputs (tf_keras' own
    ``input_names``/``output_names``; a Keras 3 model has no ``input_names``, so both are read from its graph)."""
    if keras_of(model, "tfl.serving.export") is Keras.KERAS2:
        return list(model.input_names), list(model.output_names)
    return [producing_layer_name(x) for x in model.inputs], [producing_layer_name(y) for y in model.outputs]


def _signature_function(model: Any, input_names: list[str], output_names: list[str]) -> Any:
    import tensorflow as tf

    specs = [tf.TensorSpec([None, *x.shape[1:]], x.dtype, name=n) for x, n in zip(model.inputs, input_names)]

    @tf.function(input_signature=specs)
    def serve(*tensors: Any) -> dict[str, Any]:
        outputs = model(list(tensors) if len(tensors) > 1 else tensors[0], training=False)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        return dict(zip(output_names, outputs))

    return serve


def _describe(named: Any) -> tuple[TensorSignature, ...]:
    return tuple(TensorSignature(name, spec.dtype.name, tuple(spec.shape.as_list())) for name, spec in named)


def _check_model(model: Any) -> None:
    keras_of(model, "tfl.serving.export")  # TypeError for anything that is not a Keras model
    try:
        inputs = model.inputs  # an unbuilt Keras 3 Sequential raises AttributeError here
    except AttributeError:
        inputs = None
    if not inputs:
        raise ValueError("export needs a built Keras model with known inputs (a functional or Sequential "
                         f"model with an input shape). Received: {type(model).__name__}")


@renamed(base_dir="base_path")
def export(model: Any, base_path: str | os.PathLike[str], version: int = 1, *,
           input_names: Sequence[str] | None = None, output_names: Sequence[str] | None = None,
           overwrite: bool = False, stages: int = 1, stage_boundaries: Sequence[int] | None = None,
           warmup: Any = None) -> ExportResult:
    """Writes ``model`` to ``base_path/<version>/`` with a ``serving_default`` signature.

    Args:
        model: a built Keras model (functional or Sequential with an input shape), Keras 3 (``import keras``)
            or tf_keras, built under any strategy scope or none.
        base_path: the model's base path (the folder of its numbered versions), as ``tensorfleet serve`` and
            TF Serving take it (``--model_base_path``).
        version: a positive integer; TF Serving serves the highest by default.
        input_names: the signature's input names (default: the model's input layer names).
        output_names: the signature's output names (default: the model's output layer names).
        overwrite: replace an existing version directory instead of refusing.
        stages: above 1, the model's chain of layers is also cut into this many stages, each saved
            as its own signature (``stage_0`` ...) for model-parallel serving
            (:mod:`~tensorfleet.serving.stages`).
        stage_boundaries: where the stages start (default: balanced by parameter count).
        warmup: example inputs replayed before the version takes traffic, written to TF Serving's
            ``assets.extra/tf_serving_warmup_requests``: an array (one input; each row becomes a
            one-row request) or a list of dicts of input name to array (one request each); up to 1,000.

    Returns:
        An :class:`ExportResult` naming the inputs and outputs a client sends and receives.

    Example:
        >>> import tensorfleet as tfl
        >>> result = tfl.serving.export(tfl.models.build("digits_cnn"), "models/digits", version=1)  # doctest: +SKIP
        >>> print(result.summary())                                                                # doctest: +SKIP
        exported version 1 to models/digits/1 (signature 'serving_default')
          input  image: float32[None, 8, 8, 1]
          output logits: float32[None, 10]
    """
    import tensorflow as tf

    version = integer("version", version, minimum=1)
    _check_model(model)
    default_inputs, default_outputs = _layer_names(model)
    inputs = _names(input_names, default_inputs, "input_names")
    outputs = _names(output_names, default_outputs, "output_names")
    base = Path(base_path)
    target = base / str(version)
    if base.exists() and not base.is_dir():
        raise BaseNotAFolderError(f"The model's base directory {str(base)!r} is a file; expected a folder (versions "
                                  "go to BASE/<version>/).")
    if target.exists() and not overwrite:
        raise VersionExistsError(f"Version {version} already exists at {target}; pick another version or pass "
                                 "overwrite=True (--overwrite on the command line).")
    base.mkdir(parents=True, exist_ok=True)
    module = tf.Module()
    module.weights = list(model.variables)  # tracked so the signature's captured variables are saved
    module.serve = _signature_function(model, inputs, outputs)
    signature = module.serve.get_concrete_function()
    signatures = {DEFAULT_SIGNATURE: signature}
    stage_names = _add_stages(module, model, stages, inputs, outputs, stage_boundaries, signatures)
    tmp = _new_directory(base, f".{version}")
    try:
        tf.saved_model.save(module, str(tmp), signatures=signatures)
        if warmup is not None:
            _write_warmup(tmp, warmup, inputs, base.resolve().name)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(target, version, DEFAULT_SIGNATURE,
                        _describe((spec.name, spec) for spec in module.serve.input_signature),
                        _describe(signature.structured_outputs.items()), tuple(stage_names))


def _add_stages(module: Any, model: Any, stages: int, inputs: list[str], outputs: list[str],
                boundaries: Sequence[int] | None, signatures: dict[str, Any]) -> list[str]:
    from tensorfleet.serving.stages import stage_functions, stage_names

    if integer("stages", stages, minimum=1) == 1:
        return []
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(f"Stages need a model with one input and one output (a chain of layers). Received: "
                         f"inputs {inputs}, outputs {outputs}")
    names = stage_names(stages)
    module.stages = stage_functions(model, stages, inputs[0], outputs[0], boundaries=boundaries)
    for name, function in zip(names, module.stages):
        signatures[name] = function.get_concrete_function()
    return names


def _write_warmup(directory: Path, warmup: Any, inputs: list[str], model_name: str) -> None:
    import numpy as np

    from tensorfleet.serving.warmup import write

    if isinstance(warmup, (list, tuple)) and warmup and all(isinstance(w, dict) for w in warmup):
        examples = list(warmup)
    elif len(inputs) == 1 and hasattr(warmup, "shape") and len(warmup.shape) >= 1:
        examples = [{inputs[0]: np.asarray(warmup)[i:i + 1]} for i in range(len(warmup))]
    else:
        raise ValueError(f"warmup takes an array of example rows (one input) or a list of dicts of input name "
                         f"to array (inputs {inputs}). Received: {type(warmup).__name__}")
    write(directory, examples, model_name=model_name)


def load_keras_model(path: str | os.PathLike[str]) -> Any:
    """Loads a saved Keras model for export (no compile needed): a ``.keras``/``.h5`` file with the Keras that
    wrote it (Keras 3 or tf_keras, from the file's own record), or a tf_keras SavedModel directory.

    Raises:
        FileNotFoundError: nothing at ``path``.
        KerasFileError: the file or directory is not a Keras model that can be read here (damaged, or of a
            Keras not installed); the message names the file and the cause.

    Example:
        >>> model = load_keras_model("digits.keras")                       # doctest: +SKIP
        >>> tfl.serving.export(model, "models/digits", version=1)          # doctest: +SKIP
    """
    from tensorfleet.compat.keras import load_model

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No Keras model at {str(path)!r}.")
    try:
        return load_model(path, compile=False, where="tfl.serving.load_keras_model")
    except KerasFileError as error:
        if not path.is_dir():
            raise
        raise KerasFileError(f"{error}. A SavedModel written by Keras 3's model.export() is already servable: copy "
                             "it to BASE/<version>/.") from None


def _new_directory(parent: Path, prefix: str) -> Path:
    """A new empty directory ``parent/<prefix>.<random>.tmp``, mode 0777 less the umask (mkdtemp's is 0700,
    which a TF Serving run by another user could not read)."""
    while True:
        path = parent / f"{prefix}.{secrets.token_hex(4)}.tmp"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
