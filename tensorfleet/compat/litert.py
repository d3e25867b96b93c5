"""TFLite as tensorfleet uses it: the desktop interpreter, wherever the installed stack keeps it, and one
private switch of TensorFlow's TFLite converter.

The same interpreter (``Interpreter`` and ``OpResolverType``, one API) ships in three places:

- ``ai_edge_litert.interpreter``: LiteRT, the current track's (TensorFlow 2.21; the last
  ``tflite-runtime`` release, 2.14.0 of 2023, has no wheel for Python 3.12).
- ``tflite_runtime.interpreter``: the tff track's (TensorFlow 2.14, ``tflite-runtime==2.14.0``).
- ``tf.lite.Interpreter``: TensorFlow's own copy, the last resort when neither package is installed
  (TensorFlow 2.21 says it is deprecated in favour of LiteRT and will drop it).

tensorfleet runs it with TFLite's reference kernels (``OpResolverType.BUILTIN_REF``), which TFLite
Micro's kernels are ports of. TFLite 2.14's reference kernels gave int8 outputs bit-identical to
TFLM's; LiteRT's (and TensorFlow 2.21's) differ from TFLM's by one quantization step in a few int8
outputs (0.1-0.3% of a digits CNN's, measured 2026-11-27) and by up to two steps in int16 ones, so
agreement with TFLM is stated as "within one step, and equal in most outputs".

The converter of TensorFlow 2.21 quantizes the weights of dense (FULLY_CONNECTED) layers per output
channel where 2.14's used one scale per tensor; TFLM then keeps a multiplier and a shift per channel in
the arena (the MLPerf Tiny anomaly-detection autoencoder: 19,144 bytes instead of 4,000; the digits CNN:
6,096 instead of 5,488). Only a private converter attribute turns that off (:func:`set_dense_per_channel`).

Example:
    >>> from tensorfleet.compat import litert
    >>> litert.interpreter_source() in ("ai_edge_litert", "tflite_runtime", "tensorflow")
    True
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SOURCES", "dense_per_channel_supported", "interpreter_source", "make_interpreter",
           "reference_interpreter", "set_dense_per_channel"]

# Tried in this order: the package each track installs, then TensorFlow's own copy.
SOURCES = (
    ("ai_edge_litert", "ai_edge_litert.interpreter"),
    ("tflite_runtime", "tflite_runtime.interpreter"),
)


def _module() -> tuple[str, Any, Any]:
    """(source name, ``Interpreter`` class, ``OpResolverType`` enum) of the first interpreter found."""
    for name, module_name in SOURCES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        return name, module.Interpreter, module.OpResolverType
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise ImportError("No TFLite interpreter is installed: install ai-edge-litert (the current track) or "
                          "tflite-runtime (the tff track), e.g. `pip install ai-edge-litert`.") from exc
    return "tensorflow", tf.lite.Interpreter, tf.lite.experimental.OpResolverType


def interpreter_source() -> str:
    """Which package the TFLite interpreter comes from: ``ai_edge_litert``, ``tflite_runtime`` or ``tensorflow``."""
    return _module()[0]


def make_interpreter(model_content: bytes, *, reference_kernels: bool = False) -> Any:
    """A TFLite interpreter for the flatbuffer ``model_content`` (tensors not yet allocated).

    Args:
        model_content: the ``.tflite`` bytes.
        reference_kernels: use TFLite's reference kernels (``BUILTIN_REF``, what TFLM's are ported from)
            instead of the optimized ones and XNNPACK, which round some int8 results differently.
    """
    _, interpreter, resolver = _module()
    if reference_kernels:
        return interpreter(model_content=model_content, experimental_op_resolver_type=resolver.BUILTIN_REF)
    return interpreter(model_content=model_content)


def reference_interpreter(model_content: bytes) -> Any:
    """:func:`make_interpreter` with the reference kernels, its tensors allocated."""
    interpreter = make_interpreter(model_content, reference_kernels=True)
    interpreter.allocate_tensors()
    return interpreter


# TensorFlow >= 2.16's TFLiteConverter; its public API has no equivalent (tf.lite.TFLiteConverter docs).
_DENSE_PER_CHANNEL_OFF = "_experimental_disable_per_channel_quantization_for_dense_layers"


def dense_per_channel_supported(converter: Any) -> bool:
    """Whether ``converter`` (a ``tf.lite.TFLiteConverter``) can quantize dense weights per channel.

    TensorFlow 2.14's converter cannot (dense weights get one scale per tensor); 2.21's does so by default.
    """
    return hasattr(converter, _DENSE_PER_CHANNEL_OFF)


def set_dense_per_channel(converter: Any, enabled: bool) -> None:
    """Chooses per-channel (``enabled``) or per-tensor quantization of dense layers' weights.

    Why the private attribute: the public converter API has no switch for it, and per-tensor dense weights
    keep TFLM's arena as small as TensorFlow 2.14 made it (see the module docstring).

    Raises:
        ValueError: ``enabled`` on a converter that only quantizes dense weights per tensor (TensorFlow 2.14).
    """
    if not dense_per_channel_supported(converter):
        if enabled:
            import tensorflow as tf

            raise ValueError(f"TensorFlow {tf.__version__}'s TFLite converter quantizes dense weights per tensor "
                             "only. Received: per_channel_dense=True; use the current track (TensorFlow 2.21) "
                             "or per_channel_dense=False.")
        return
    setattr(converter, _DENSE_PER_CHANNEL_OFF, not enabled)
