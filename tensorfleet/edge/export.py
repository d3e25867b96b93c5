"""C sources for a microcontroller build, in TFLite Micro's conventions.

``export_c(artifact, out_dir, name)`` writes three files:

* ``<name>_model_data.h``: ``extern const unsigned char g_<name>_model_data[];`` and
  ``extern const unsigned int g_<name>_model_data_len;`` (plus the arena size when known).
* ``<name>_model_data.cc``: the flatbuffer as ``alignas(16) const unsigned char`` (TFLM reads
  the flatbuffer in place, and its tensors need 16-byte alignment).
* ``<name>_op_resolver.h``: ``<Name>OpResolver`` = ``tflite::MicroMutableOpResolver<N>`` with
  exactly the model's N operators, and ``Register<Name>Ops(resolver)`` that adds them.

Every file is written atomically; a bad name or an op TFLM lacks fails before anything is written.

Example:
    >>> paths = export_c(artifact, "out/", name="kws")   # doctest: +SKIP
    >>> sorted(p.name for p in paths)                     # doctest: +SKIP
    ['kws_model_data.cc', 'kws_model_data.h', 'kws_op_resolver.h']
"""

from __future__ import annotations

import keyword
import os
import re
from pathlib import Path

from tensorfleet.edge.artifact import TFLiteArtifact
from tensorfleet.edge.errors import UnsupportedOpError
from tensorfleet.edge.micro import MAX_ARENA_BYTES
from tensorfleet.edge.ops import MICRO_CUSTOM_OPS, MICRO_OPS, unsupported_ops, with_advice
from tensorfleet.io import check_writable, write_text
from tensorfleet.validation import integer, renamed

__all__ = ["check_c_name", "sanitize_c_identifier", "export_c", "model_data_source", "op_resolver_source"]

_C_KEYWORDS = frozenset("""alignas alignof and asm auto bool break case catch char class const constexpr
continue decltype default delete do double else enum explicit export extern false float for friend goto if
inline int long mutable namespace new noexcept not nullptr operator or private protected public register
return short signed sizeof static struct switch template this throw true try typedef typeid typename union
unsigned using virtual void volatile while""".split())


def sanitize_c_identifier(name: str) -> str:
    """Turns ``name`` into a C identifier: ``"kws-model v2"`` -> ``"kws_model_v2"``.

    Raises:
        ValueError: ``name`` has no letter or digit to keep.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string. Received: {name!r} ({type(name).__name__})")
    ident = re.sub(r"[^0-9A-Za-z_]+", "_", name.strip()).strip("_")
    ident = re.sub(r"_+", "_", ident)
    if not ident:
        raise ValueError(f"name must contain a letter or digit to form a C identifier. Received: name={name!r}")
    if ident[0].isdigit():
        ident = f"model_{ident}"
    if ident in _C_KEYWORDS or keyword.iskeyword(ident):
        ident = f"{ident}_model"
    return ident


_C_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*")


def check_c_name(name: str) -> str:
    """``name`` if it can name the exported files and symbols as it is; else ``ValueError`` with why.

    The name becomes ``g_<name>_model_data``, ``k<Name>TensorArenaSize``, ``<Name>OpResolver``
    and ``<name>_model_data.h``, so it must be letters, digits and single underscores, starting
    with a letter (a leading digit breaks ``<Name>OpResolver``; ``__`` is reserved in C++).
    Nothing is rewritten silently: the error suggests a name that works.

    Example:
        >>> check_c_name("kws_v2")
        'kws_v2'
        >>> check_c_name("kws-v2")
        Traceback (most recent call last):
        ValueError: name must be letters, digits and single underscores, starting with a letter (it becomes
        g_<name>_model_data and <Name>OpResolver); '-' is not allowed. Received: name='kws-v2'. Use e.g. name='kws_v2'.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string. Received: {name!r} ({type(name).__name__})")
    if _C_NAME.fullmatch(name):
        return name
    bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c == "_"))})
    if bad:
        reason = f"{', '.join(repr(c) for c in bad)} {'is' if len(bad) == 1 else 'are'} not allowed"
    elif not name:
        reason = "it is empty"
    elif not name[0].isalpha():
        reason = f"it starts with {name[0]!r}"
    else:
        reason = "'__' and a trailing '_' are reserved in C++ once it is part of g_<name>_model_data"
    try:
        suggestion = f" Use e.g. name={sanitize_c_identifier(name)!r}."
    except ValueError:
        suggestion = ""
    raise ValueError(f"name must be letters, digits and single underscores, starting with a letter (it becomes "
                     f"g_<name>_model_data and <Name>OpResolver); {reason}. Received: name={name!r}.{suggestion}")


def _camel(ident: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in ident.split("_") if part)


@renamed(arena_size="arena_bytes")
def model_data_source(artifact: TFLiteArtifact, ident: str, *, arena_bytes: int | None = None) -> tuple[str, str]:
    """The ``.h`` and ``.cc`` texts holding the flatbuffer as ``g_<ident>_model_data``."""
    guard = f"TENSORFLEET_{ident.upper()}_MODEL_DATA_H_"
    arena = (f"\n// Tensor arena for this model: the smallest with which the TFLite Micro Python interpreter\n"
             f"// runs it (measured). That interpreter's RecordingMicroAllocator keeps its records in the\n"
             f"// arena; with the plain MicroAllocator this firmware needs a little less (240-424 bytes\n"
             f"// less as measured on a 64-bit host), so the size is safe to declare.\n"
             f"constexpr unsigned int k{_camel(ident)}TensorArenaSize = {arena_bytes};\n") if arena_bytes else ""
    header = (
        f"// Generated by tensorfleet.edge.export_c: {artifact.size} bytes, quantization {artifact.quantization}.\n"
        f"// Do not edit; regenerate from the .tflite file.\n"
        f"#ifndef {guard}\n#define {guard}\n\n"
        f"extern const unsigned char g_{ident}_model_data[];\n"
        f"extern const unsigned int g_{ident}_model_data_len;\n{arena}\n"
        f"#endif  // {guard}\n")
    rows = []
    data = artifact.data
    for start in range(0, len(data), 12):
        rows.append("  " + ", ".join(f"0x{b:02x}" for b in data[start:start + 12]) + ",")
    source = (
        f"// Generated by tensorfleet.edge.export_c. Do not edit.\n"
        f'#include "{ident}_model_data.h"\n\n'
        f"// TFLite Micro reads the flatbuffer in place; its buffers need 16-byte alignment.\n"
        f"alignas(16) const unsigned char g_{ident}_model_data[] = {{\n" + "\n".join(rows) + "\n};\n"
        f"const unsigned int g_{ident}_model_data_len = {len(data)};\n")
    return header, source


def op_resolver_source(artifact: TFLiteArtifact, ident: str) -> str:
    """A header with ``<Ident>OpResolver`` (exactly the model's ops) and ``Register<Ident>Ops``."""
    operators = artifact.graph.operators
    missing = unsupported_ops([(op.op, op.custom) for op in operators])
    if missing:
        raise UnsupportedOpError(
            f"Cannot generate an op resolver: TFLite Micro has no kernel for {with_advice(missing)}.", missing)
    methods = sorted({(op.op, (MICRO_CUSTOM_OPS if op.custom else MICRO_OPS)[op.op]) for op in operators})
    camel = _camel(ident)
    guard = f"TENSORFLEET_{ident.upper()}_OP_RESOLVER_H_"
    adds = "\n".join(f"  if (resolver.{method}() != kTfLiteOk) return kTfLiteError;  // {op}"
                     for op, method in methods)
    return (
        f"// Generated by tensorfleet.edge.export_c: the {len(methods)} operator(s) this model uses.\n"
        f"#ifndef {guard}\n#define {guard}\n\n"
        f'#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"\n\n'
        f"using {camel}OpResolver = tflite::MicroMutableOpResolver<{len(methods)}>;\n\n"
        f"inline TfLiteStatus Register{camel}Ops({camel}OpResolver& resolver) {{\n{adds}\n  return kTfLiteOk;\n}}\n\n"
        f"#endif  // {guard}\n")


@renamed(arena_size="arena_bytes")
def export_c(artifact: TFLiteArtifact, out_dir: str | os.PathLike[str], name: str, *,
             arena_bytes: int | None = None) -> list[Path]:
    """Writes ``<name>_model_data.h/.cc`` and ``<name>_op_resolver.h`` into ``out_dir``.

    Args:
        artifact: the converted model.
        out_dir: directory to write into (created if missing).
        name: base name of the files and symbols, used as given: letters, digits and single
            underscores, starting with a letter (see :func:`check_c_name`; ``"kws-v2"`` is refused
            with ``kws_v2`` suggested).
        arena_bytes: if given, the header also declares ``k<Name>TensorArenaSize`` (1 byte to
            :data:`~tensorfleet.edge.micro.MAX_ARENA_BYTES`).

    Returns:
        The paths written, header first.

    Raises:
        UnsupportedOpError: the model has an op TFLM lacks (nothing is written).
        ValueError: ``name`` is not usable as it is, or ``arena_bytes`` is out of range.
        UnwritablePathError: ``out_dir`` cannot be written (nothing is written).

    Example:
        >>> export_c(artifact, "firmware/model", name="kws")   # doctest: +SKIP
    """
    if not isinstance(artifact, TFLiteArtifact):
        raise TypeError(f"artifact must be a TFLiteArtifact. Received: {type(artifact).__name__}")
    integer("arena_bytes", arena_bytes, minimum=1, maximum=MAX_ARENA_BYTES, optional=True)
    ident = check_c_name(name)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir must be a directory. Received: out_dir={str(out)!r} (a file)")
    check_writable(out / f"{ident}_model_data.h")
    resolver = op_resolver_source(artifact, ident)  # fails before any file is written
    header, source = model_data_source(artifact, ident, arena_bytes=arena_bytes)
    return [write_text(out / f"{ident}_model_data.h", header),
            write_text(out / f"{ident}_model_data.cc", source),
            write_text(out / f"{ident}_op_resolver.h", resolver)]
