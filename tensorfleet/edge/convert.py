"""From a Keras model to a TFLite flatbuffer, with every quantization mode in one registry.

Modes (see the TFLite post-training quantization guide, tensorflow.org/lite/performance/
post_training_quantization):

* ``float32``: no quantization.
* ``dynamic``: dynamic-range, int8 weights, float activations (hybrid kernels; not for TFLM).
* ``float16``: float16 weights dequantized at load (not for TFLM).
* ``int8``: full integer, int8 inputs and outputs, integer-only builtins (what TFLM runs).
* ``int16x8``: int16 activations with int8 weights, for accuracy-sensitive models.

Example:
    >>> import tensorfleet as tfl
    >>> artifact = tfl.edge.convert(model, quantization="int8",        # doctest: +SKIP
    ...                             representative_data=split.x_train)
    >>> artifact.inputs[0].dtype                                         # doctest: +SKIP
    'int8'
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from tensorfleet.compat.keras import Keras, keras_of, module_of
from tensorfleet.compat.litert import set_dense_per_channel
from tensorfleet.edge.artifact import TFLiteArtifact, infer_quantization, verify_int8
from tensorfleet.edge.errors import EdgeWarning, QuantizationError
from tensorfleet.registry import Registry
from tensorfleet.validation import positive_int

__all__ = ["Quantization", "QUANTIZATIONS", "QuantizationMode", "convert", "load_keras_model",
           "representative_dataset"]


class Quantization(str, Enum):
    """The quantization modes ``convert`` accepts; the same words work on the CLI."""

    FLOAT32 = "float32"
    DYNAMIC = "dynamic"
    FLOAT16 = "float16"
    INT8 = "int8"
    INT16X8 = "int16x8"


@dataclass(frozen=True)
class QuantizationMode:
    """How a mode sets up the converter, and whether it needs representative data."""

    configure: Callable[[Any, Callable[[], Iterable[list[np.ndarray]]] | None], None]
    needs_representative_data: bool
    micro_compatible: bool


def _float32(converter: Any, rep: Any) -> None:
    del converter, rep


def _dynamic(converter: Any, rep: Any) -> None:
    import tensorflow as tf

    converter.optimizations = [tf.lite.Optimize.DEFAULT]


def _float16(converter: Any, rep: Any) -> None:
    import tensorflow as tf

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]


def _full_integer(converter: Any, rep: Any, ops_set: str, io_type: str) -> None:
    import tensorflow as tf

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = rep
    converter.target_spec.supported_ops = [getattr(tf.lite.OpsSet, ops_set)]
    converter.inference_input_type = getattr(tf, io_type)
    converter.inference_output_type = getattr(tf, io_type)


def _int8(converter: Any, rep: Any) -> None:
    _full_integer(converter, rep, "TFLITE_BUILTINS_INT8", "int8")


def _int16x8(converter: Any, rep: Any) -> None:
    _full_integer(converter, rep, "EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8", "int16")


QUANTIZATIONS: Registry[QuantizationMode] = Registry("quantization mode")
QUANTIZATIONS.register("float32", QuantizationMode(_float32, False, True), aliases=("none", "fp32"),
                       description="No quantization; float32 weights and activations.")
QUANTIZATIONS.register("dynamic", QuantizationMode(_dynamic, False, False), aliases=("dynamic_range",),
                       description="Dynamic-range: int8 weights, float activations (hybrid ops; TFLM lacks them).")
QUANTIZATIONS.register("float16", QuantizationMode(_float16, False, False), aliases=("fp16",),
                       description="float16 weights, float32 compute (TFLM cannot run float16 weights).")
QUANTIZATIONS.register("int8", QuantizationMode(_int8, True, True), aliases=("full_int8", "full_integer"),
                       description="Full integer: int8 inputs, outputs and integer-only builtins; for TFLM.")
QUANTIZATIONS.register("int16x8", QuantizationMode(_int16x8, True, True), aliases=("16x8",),
                       description="int16 activations, int8 weights; int16 inputs and outputs.")


def check_samples_shape(shape: tuple[int, ...], input_shape: tuple[int | None, ...], message: str) -> None:
    """ValueError unless an array of ``shape`` holds samples shaped like a model's input (``input_shape``, the
    batch dimension first); ``message`` says so with ``{shape}`` standing for the expected ``(n, ...)``."""
    expected = tuple(input_shape[1:])
    if len(shape) != len(expected) + 1 or any(e is not None and e != a for e, a in zip(expected, shape[1:])):
        shown = "(n, " + ", ".join(str(e) for e in expected) + ")"
        raise ValueError(f"{message.format(shape=shown)} Received: shape={tuple(shape)}")


def representative_dataset(data: Any, input_shape: tuple[int | None, ...], *, num_samples: int = 100,
                           progress: bool = True) -> Callable[[], Iterable[list[np.ndarray]]]:
    """Checks calibration samples against the model's input shape; returns the converter's generator.

    Args:
        data: an array ``(n, *input_shape)``, or a ``tf.data.Dataset`` of single unbatched samples.
        input_shape: the model's input shape including the batch dimension (``model.input_shape``).
        num_samples: at most this many samples are used.
    """
    positive_int("num_samples", num_samples)
    if hasattr(data, "as_numpy_iterator"):  # tf.data.Dataset
        data = np.stack(list(data.take(num_samples).as_numpy_iterator()))
    try:
        array = np.asarray(data, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"representative_data must be a numeric array or tf.data.Dataset. "
                        f"Received: {type(data).__name__}") from exc
    check_samples_shape(array.shape, input_shape, "representative_data must have shape {shape} to match the model's "
                                                   "input.")
    if len(array) == 0:
        raise ValueError("representative_data must hold at least one sample. Received: 0 samples")
    if not np.all(np.isfinite(array)):
        raise ValueError("representative_data must be finite; it contains NaN or infinity.")
    array = array[:num_samples]

    def generate() -> Iterable[list[np.ndarray]]:
        from tqdm.auto import tqdm

        for sample in tqdm(array, desc="calibrating", unit="sample", disable=not progress, leave=False):
            yield [sample[None, ...]]

    return generate


def load_keras_model(spec: Any) -> Any:
    """A Keras model, in the Keras it was written in, from a model object, a ``tensorfleet.models`` name or a saved
    model: a ``.keras``/``.h5`` file is read by the Keras that wrote it (Keras 3 or tf_keras), a SavedModel folder
    by tf_keras (Keras 3 cannot load a SavedModel as a model); a zoo name is built in the Keras ``tf.keras`` is in
    the caller's process. A name and a path are told apart by :func:`tensorfleet.models.model_file`: what exists
    is a file, a name with ``.keras``/``.h5`` or a path separator is never a zoo name.

    Raises:
        FileNotFoundError: ``spec`` names no file and no zoo model, and looks like a path (``.keras``, ``.h5``, ``/``).
        UnknownNameError: ``spec`` names no file and no zoo model (the zoo's names, and the closest one).
        KerasFileError: the file or folder is damaged or holds no Keras model (the message names it).
        TypeError: ``spec`` is neither a Keras model, a path nor a name.
    """
    from tensorfleet import models
    from tensorfleet.compat.keras import load_model

    if isinstance(spec, (str, os.PathLike)):
        path = models.model_file(spec)
        if path is None:
            return models.build(str(spec))
        _register_wrappers(path)
        return _keras_model(load_model(path, compile=False, where="tfl.edge"), "tfl.edge")
    return _keras_model(spec, "tfl.edge.convert")


def _register_wrappers(path: Path) -> None:
    """Makes the Keras 3 route's QAT, pruning and clustering wrappers known to Keras 3's loader, so that a model
    saved with them on loads in a new process (tfmot's are tf_keras's, found by tfmot's own scope)."""
    from tensorfleet.compat.keras import KerasFileError, saved_keras

    try:
        if path.is_file() and saved_keras(path) is Keras.KERAS3:
            from tensorfleet.edge.keras3_optimize import custom_objects

            custom_objects()  # registers them (keras.saving.register_keras_serializable)
    except KerasFileError:
        return  # the loader says what is wrong with the file


def _keras_model(model: Any, where: str) -> Any:
    """``model`` if it is a model of either Keras; else one clear error."""
    if not isinstance(model, module_of(model, where).Model):
        raise TypeError(f"{where} takes a Keras model (Keras 3 or tf_keras). Received: {type(model).__qualname__}")
    return model


def _keras3_inputs(model: Any) -> Any:
    """The symbolic inputs of a Keras 3 model, in the structure its ``call`` takes (a functional model's
    ``input``, a Sequential model's one input).

    Raises:
        ValueError: a subclassed model, which has no inputs of its own (the message shows how to give it some).
    """
    try:
        return model.input
    except (AttributeError, ValueError):  # a Sequential model has its inputs, not an input node of its own
        pass
    inputs = list(getattr(model, "inputs", None) or [])
    if not inputs:
        raise ValueError(f"tfl.edge.convert needs the input shape of a Keras 3 model, and {type(model).__name__!r} "
                         "(a subclassed model) has no inputs of its own. Wrap it in a functional model: "
                         "`inputs = keras.Input(shape); keras.Model(inputs, model(inputs))`. Received: "
                         f"{type(model).__qualname__} with inputs=None")
    return inputs[0] if len(inputs) == 1 else inputs


def _recurrent_loops(model: Any) -> list[str]:
    """The recurrent layers of ``model`` (nested ones too) that run their time steps as a loop (``unroll=False``),
    as ``"LSTM 'lstm'"``; the converter turns each into a WHILE op or a loop of tensor lists."""
    found: list[str] = []

    def visit(layer: Any) -> None:
        if hasattr(layer, "cell") and getattr(layer, "unroll", True) is False:
            found.append(f"{type(layer).__name__} {layer.name!r}")
            return
        for child in [getattr(layer, "forward_layer", None), getattr(layer, "backward_layer", None),
                      getattr(layer, "layer", None), *(getattr(layer, "layers", None) or [])]:
            if child is not None and child is not layer:
                visit(child)

    for layer in model.layers:
        visit(layer)
    return found


_UNROLL = ("build the recurrent layer with unroll=True (its time steps become plain operators; the sequence "
           "length must be fixed)")


def _convertible_loops(model: Any, name: str, full_integer: bool) -> list[str]:
    """The model's recurrent loops (:func:`_recurrent_loops`); a Keras 3 subclassed model, or a Keras 3 loop in a
    full-integer mode, refused first."""
    if keras_of(model) is not Keras.KERAS3:
        return _recurrent_loops(model)
    _keras3_inputs(model)  # a subclassed model is refused before calibration data is looked at
    loops = _recurrent_loops(model)
    if loops and full_integer:
        # TensorFlow 2.21's converter ends the process (SIGSEGV) calibrating the WHILE op of such a layer.
        raise QuantizationError(f"quantization={name!r} cannot convert a recurrent layer that loops over its time "
                                f"steps: {', '.join(loops)} (TensorFlow's converter crashes calibrating the loop). "
                                f"{_UNROLL[0].upper()}{_UNROLL[1:]}, or use 'dynamic', 'float16' or 'float32'.")
    return loops


def _run(converter: Any, name: str, loops: list[str]) -> bytes:
    """The converter's flatbuffer; its failure as a QuantizationError with its last line (the cause attached)."""
    try:
        return bytes(converter.convert())
    except Exception as exc:  # the converter's own messages are long; keep the cause attached
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        if loops and "tensor list ops" in str(exc):  # its advice (Select TF ops) is no use on a microcontroller
            last = (f"{', '.join(loops)} loops over its time steps with tensor lists, which TFLite's builtin "
                    f"operators cannot lower: {_UNROLL}")
        raise QuantizationError(f"The TFLite converter failed for quantization={name!r}: {last}") from exc


@contextlib.contextmanager
def _converter(model: Any) -> Iterator[Any]:
    """The TFLite converter for a model of either Keras, for the time of a ``with`` block.

    A tf_keras model goes through ``from_keras_model``. A Keras 3 model is exported by Keras itself
    (``model.export(format="tf_saved_model")``, which keeps TFLite builtins only: Keras's
    ``format="litert"`` would turn SELECT_TF_OPS on) with a batch of one, and read back with
    ``from_saved_model``: Keras 3's ``Flatten`` and ``Reshape`` read the batch size at run time, which a
    dynamic batch turns into SHAPE, STRIDED_SLICE and PACK operators (flash and arena a microcontroller
    running one sample at a time does not need); with the batch fixed they fold into one RESHAPE, as
    tf_keras's do. The flatbuffer's shapes are those of tf_keras's ``(1, ...)`` (its shape signature
    keeps batch 1 instead of -1).
    """
    import tempfile

    import tensorflow as tf

    if keras_of(model) is not Keras.KERAS3:
        yield tf.lite.TFLiteConverter.from_keras_model(model)
        return

    def spec(tensor: Any) -> Any:
        shape = tuple(tensor.shape)
        return tf.TensorSpec((1 if shape[0] is None else shape[0], *shape[1:]), tensor.dtype,
                             name=getattr(tensor, "name", None))

    signature = [tf.nest.map_structure(spec, _keras3_inputs(model))]
    with tempfile.TemporaryDirectory(prefix="tfl-edge-") as folder:
        model.export(folder, format="tf_saved_model", input_signature=signature, verbose=False)
        yield tf.lite.TFLiteConverter.from_saved_model(folder)  # it reads the folder when it converts


def convert(model: Any, quantization: str | Quantization = Quantization.FLOAT32, representative_data: Any = None,
            *, num_calibration_samples: int = 100, per_channel_dense: bool = False, verify: bool = True,
            progress: bool = True) -> TFLiteArtifact:
    """Converts a Keras model to TFLite with one quantization mode.

    Args:
        model: a Keras model (Keras 3 or tf_keras), a ``tensorfleet.models`` name or a saved Keras model path.
        quantization: ``float32``, ``dynamic``, ``float16``, ``int8`` or ``int16x8``.
        representative_data: calibration samples shaped like the model input (needed by
            ``int8`` and ``int16x8``); at most ``num_calibration_samples`` are used.
        per_channel_dense: for ``int8`` and ``int16x8``, quantize dense (FULLY_CONNECTED) weights with one
            scale per output unit, as TensorFlow 2.21's converter does by default, instead of one per tensor
            (TensorFlow 2.14's only way). Per tensor is the default: TFLM keeps a multiplier and a shift per
            channel in the arena (the MLPerf Tiny autoencoder needs 19,144 bytes instead of 4,000).
            Convolutions are quantized per channel either way.
        verify: for ``int8``, check every input, output and op is integer
            (raises :class:`~tensorfleet.edge.errors.QuantizationError` otherwise).

    Returns:
        A :class:`TFLiteArtifact` with the flatbuffer and its metadata.

    Raises:
        QuantizationError: the TFLite converter failed (its last line in the message, the cause attached).
        TypeError: ``model`` is not a Keras model, a path or a zoo name.
        ValueError: a Keras 3 subclassed model, which has no input shape of its own; bad representative data.

    Example:
        >>> artifact = convert(model, "int8", representative_data=x_train[:100])  # doctest: +SKIP
        >>> artifact.metadata()["inputs"][0]["dtype"]                              # doctest: +SKIP
        'int8'
    """
    if not isinstance(model, (str, os.PathLike)):
        _keras_model(model, "tfl.edge.convert")  # before the options: a wrong object is the first thing to say
    name = QUANTIZATIONS.canonical(quantization.value if isinstance(quantization, Quantization) else quantization)
    mode = QUANTIZATIONS.get(name)
    if per_channel_dense and not mode.needs_representative_data:
        raise ValueError(f"per_channel_dense applies to the full-integer modes (int8, int16x8). Received: "
                         f"per_channel_dense=True with quantization={name!r}")
    keras_model = load_keras_model(model)
    if {type(layer).__name__ for layer in keras_model.layers} & {"PruneLowMagnitude", "ClusterWeights"}:
        from tensorfleet.edge.optimize import strip_wrappers

        keras_model = strip_wrappers(keras_model)  # the wrappers' masks and centroids are training-only
    loops = _convertible_loops(keras_model, name, mode.needs_representative_data)
    rep = None
    if mode.needs_representative_data:
        if representative_data is None:
            raise ValueError(f"quantization={name!r} needs representative_data: a few hundred input samples "
                             f"shaped like {keras_model.input_shape[1:]}. Received: representative_data=None")
        rep = representative_dataset(representative_data, keras_model.input_shape,
                                     num_samples=num_calibration_samples, progress=progress)
    with _converter(keras_model) as converter:
        mode.configure(converter, rep)
        if mode.needs_representative_data:  # the full-integer modes, whose dense weights TFLM requantizes
            set_dense_per_channel(converter, bool(per_channel_dense))
        data = _run(converter, name, loops)
    artifact = TFLiteArtifact(data, name, keras_model)
    if verify and name == Quantization.INT8.value:
        verify_int8(artifact)
    if name == Quantization.DYNAMIC.value and infer_quantization(artifact.graph) == "float32":
        warnings.warn("quantization='dynamic' left every weight in float32: TensorFlow's converter quantizes only "
                      "weight tensors of 1,024 elements or more, and this model has none. The file is a float32 "
                      "model; 'int8' quantizes every weight.", EdgeWarning, stacklevel=2)
    return artifact
