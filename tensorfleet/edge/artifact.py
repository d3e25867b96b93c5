"""A converted TFLite model: the flatbuffer bytes and what tensorfleet reads out of them.

The flatbuffer is parsed with the schema module that ships in the ``tflite-micro`` wheel
(``tflite_micro.tensorflow.lite.micro.python.schema_py_generated``), so tensorfleet sees the
same tensors, quantization parameters and operators as the TFLite Micro interpreter.

Example:
    >>> artifact = TFLiteArtifact.from_file("model.tflite")       # doctest: +SKIP
    >>> artifact.inputs[0].dtype, artifact.ops                       # doctest: +SKIP
    ('int8', ('CONV_2D', 'MAX_POOL_2D', 'RESHAPE', 'FULLY_CONNECTED'))
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from tensorfleet.edge.errors import InvalidModelError, QuantizationError
from tensorfleet.io import write_bytes

__all__ = ["TensorInfo", "OpInfo", "Graph", "TFLiteArtifact", "activation_dtype", "infer_quantization", "parse_graph",
           "verify_int8", "weight_dtypes"]

_DTYPES = {
    "FLOAT32": "float32", "FLOAT16": "float16", "INT32": "int32", "UINT8": "uint8", "INT64": "int64",
    "STRING": "string", "BOOL": "bool", "INT16": "int16", "COMPLEX64": "complex64", "INT8": "int8",
    "FLOAT64": "float64", "COMPLEX128": "complex128", "UINT64": "uint64", "RESOURCE": "resource",
    "VARIANT": "variant", "UINT32": "uint32", "UINT16": "uint16", "INT4": "int4", "BFLOAT16": "bfloat16",
}
_ITEMSIZE = {"float32": 4, "float16": 2, "int32": 4, "uint8": 1, "int64": 8, "bool": 1, "int16": 2,
             "int8": 1, "float64": 8, "uint64": 8, "uint32": 4, "uint16": 2, "complex64": 8,
             "complex128": 16, "bfloat16": 2, "int4": 1}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the graph: dtype name, shape, quantization and whether it is a constant."""

    index: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    scales: tuple[float, ...] = ()
    zero_points: tuple[int, ...] = ()
    quantized_dimension: int = 0
    is_constant: bool = False

    @property
    def num_elements(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.num_elements * _ITEMSIZE.get(self.dtype, 1)

    @property
    def is_quantized(self) -> bool:
        return bool(self.scales)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "scales": [float(s) for s in self.scales][:8], "num_scales": len(self.scales),
                "zero_points": [int(z) for z in self.zero_points][:8]}


@dataclass(frozen=True)
class OpInfo:
    """One operator in execution order: its name (builtin or custom) and tensor indices."""

    index: int
    op: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    custom: bool = False


@dataclass(frozen=True)
class Graph:
    """The first subgraph of a model, flattened into tensors and operators."""

    tensors: tuple[TensorInfo, ...]
    operators: tuple[OpInfo, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    num_subgraphs: int


def _enum_names(enum_cls: Any) -> dict[int, str]:
    return {v: k for k, v in vars(enum_cls).items() if not k.startswith("_") and isinstance(v, int)}


def parse_graph(data: bytes) -> Graph:
    """Parses a TFLite flatbuffer; raises :class:`InvalidModelError` for anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"A TFLite model must be bytes. Received: {type(data).__name__}")
    data = bytes(data)
    if len(data) == 0:
        raise InvalidModelError("The TFLite model is empty (0 bytes); expected a .tflite flatbuffer.")
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise InvalidModelError(
            f"Not a TFLite flatbuffer: the file identifier at bytes 4..8 is {data[4:8]!r}, expected b'TFL3' "
            f"(size {len(data)} bytes). Convert the model with tensorfleet.edge.convert().")
    from tflite_micro.python.tflite_micro import runtime
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as fb

    try:
        model = runtime.convert_bytearray_to_object(bytearray(data))
        builtin = _enum_names(fb.BuiltinOperator)
        types = _enum_names(fb.TensorType)
        if not model.subgraphs:
            raise InvalidModelError("The TFLite model has no subgraph.")
        sub = model.subgraphs[0]
        buffers = model.buffers or []
        tensors = []
        for i, t in enumerate(sub.tensors or []):
            q = t.quantization
            scales = tuple(float(s) for s in (q.scale if q is not None and q.scale is not None else ()))
            zps = tuple(int(z) for z in (q.zeroPoint if q is not None and q.zeroPoint is not None else ()))
            buf = buffers[t.buffer] if 0 <= t.buffer < len(buffers) else None
            has_data = buf is not None and ((buf.data is not None and len(buf.data) > 0) or buf.size > 0)
            shape = tuple(int(d) for d in (t.shape if t.shape is not None else ()))
            name = t.name.decode() if isinstance(t.name, bytes) else str(t.name)
            tensors.append(TensorInfo(i, name, _DTYPES.get(types.get(t.type, ""), f"type{t.type}"), shape,
                                      scales, zps, int(q.quantizedDimension) if q is not None else 0,
                                      bool(has_data)))
        ops = []
        for k, op in enumerate(sub.operators or []):
            code = model.operatorCodes[op.opcodeIndex]
            number = runtime.get_builtin_code_from_operator_code(code)
            name = builtin.get(number, f"BUILTIN_{number}")
            custom = name == "CUSTOM"
            if custom:
                cc = code.customCode
                name = cc.decode() if isinstance(cc, bytes) else str(cc)
            ops.append(OpInfo(k, name, tuple(int(i) for i in (op.inputs if op.inputs is not None else ())),
                              tuple(int(i) for i in (op.outputs if op.outputs is not None else ())), custom))
        return Graph(tuple(tensors), tuple(ops), tuple(int(i) for i in sub.inputs),
                     tuple(int(i) for i in sub.outputs), len(model.subgraphs))
    except InvalidModelError:
        raise
    except Exception as exc:  # flatbuffers raises assorted errors on truncated data
        raise InvalidModelError(
            f"The TFLite flatbuffer is corrupt or truncated ({len(data)} bytes): {type(exc).__name__}: {exc}"
        ) from exc


@dataclass(eq=False)
class TFLiteArtifact:
    """A TFLite flatbuffer with its metadata.

    Attributes:
        data: the flatbuffer bytes, exactly what goes into flash.
        quantization: the mode it was converted with (inferred from the graph when loaded from a file).
        source_model: the Keras model it came from, when known (used to report the accuracy drop).

    Example:
        >>> artifact = tensorfleet.edge.convert(model, quantization="int8",   # doctest: +SKIP
        ...                                     representative_data=x_train)
        >>> artifact.size, artifact.inputs[0].scales                           # doctest: +SKIP
        (43272, (0.00392157,))
    """

    data: bytes
    quantization: str = ""
    source_model: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.data, (bytes, bytearray, memoryview)):
            raise TypeError(f"A TFLite model must be bytes. Received: {type(self.data).__name__}")
        self.data = bytes(self.data)
        self.graph  # parse now: a corrupt model fails at the boundary, not later
        if not self.quantization:
            self.quantization = infer_quantization(self.graph)

    @cached_property
    def graph(self) -> Graph:
        return parse_graph(self.data)

    @classmethod
    def from_bytes(cls, data: bytes, *, quantization: str = "") -> TFLiteArtifact:
        return cls(data, quantization)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TFLiteArtifact:
        """Reads a ``.tflite`` file; raises FileNotFoundError or InvalidModelError."""
        from tensorfleet.io import existing_file

        p = existing_file(path, "a .tflite file (a TFLite flatbuffer)")
        try:
            return cls(p.read_bytes())
        except InvalidModelError as error:  # the bytes' fault, said with the file's name
            raise InvalidModelError(f"{str(p)!r}: {error}") from None

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Writes the flatbuffer atomically to ``path``."""
        return write_bytes(path, self.data)

    @property
    def size(self) -> int:
        """Flash bytes: the length of the flatbuffer."""
        return len(self.data)

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return tuple(self.graph.tensors[i] for i in self.graph.inputs)

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        return tuple(self.graph.tensors[i] for i in self.graph.outputs)

    @property
    def ops(self) -> tuple[str, ...]:
        """Operator names in execution order."""
        return tuple(op.op for op in self.graph.operators)

    @property
    def op_types(self) -> tuple[str, ...]:
        """Distinct operator names, sorted."""
        return tuple(sorted(set(self.ops)))

    def quantize_input(self, x: np.ndarray, index: int = 0) -> np.ndarray:
        """Maps float inputs to the model's input dtype with its scale and zero point; inputs without
        quantization (float, or raw integers such as int16 audio samples) are only cast."""
        return _quantize(np.asarray(x), self.inputs[index])

    def dequantize_output(self, y: np.ndarray, index: int = 0) -> np.ndarray:
        """Maps raw outputs to float (identity for float outputs)."""
        info = self.outputs[index]
        y = np.asarray(y)
        if info.dtype in ("int8", "int16", "uint8") and info.scales:
            return ((y.astype(np.float32) - info.zero_points[0]) * info.scales[0]).astype(np.float32)
        return y.astype(np.float32)

    def metadata(self) -> dict[str, Any]:
        """JSON-ready summary: size, mode, activation and weight dtypes, inputs/outputs (dtype, shape,
        scale, zero point), ops."""
        return {"bytes": self.size, "quantization": self.quantization,
                "activations": activation_dtype(self.graph), "weights": list(weight_dtypes(self.graph)),
                "inputs": [t.as_dict() for t in self.inputs], "outputs": [t.as_dict() for t in self.outputs],
                "ops": list(self.ops), "op_types": list(self.op_types)}


def _quantize(x: np.ndarray, info: TensorInfo) -> np.ndarray:
    if info.dtype in ("int8", "int16", "uint8") and info.scales:
        limits = np.iinfo(np.dtype(info.dtype))
        q = np.round(x.astype(np.float64) / info.scales[0]) + info.zero_points[0]
        return np.clip(q, limits.min, limits.max).astype(info.dtype)
    return x.astype(info.dtype)


_FLOAT = {"float32", "float16", "float64", "bfloat16"}


# Constant inputs of these types are weights; int32/int64 constants are biases, shapes and indices.
_WEIGHT_TYPES = {"float32", "float16", "bfloat16", "float64", "int8", "int16", "int4", "uint8"}


def weight_dtypes(graph: Graph) -> tuple[str, ...]:
    """The dtypes of the weights: constant operator inputs other than biases, shapes and indices."""
    return tuple(sorted({graph.tensors[i].dtype for op in graph.operators for i in op.inputs
                         if i >= 0 and graph.tensors[i].is_constant and graph.tensors[i].dtype in _WEIGHT_TYPES}))


def activation_dtype(graph: Graph) -> str:
    """The dtype the model computes in: the first variable input of each operator that has weights,
    most common first (else of every operator). An int8 LSTM's int16 cell state or an int16 input
    requantized to int8 does not change it."""
    def first_variable(op: OpInfo) -> str | None:
        return next((graph.tensors[i].dtype for i in op.inputs if i >= 0 and not graph.tensors[i].is_constant),
                    None)

    weighted = [op for op in graph.operators if any(
        i >= 0 and graph.tensors[i].is_constant and graph.tensors[i].dtype in _WEIGHT_TYPES for i in op.inputs)]
    for ops in (weighted, graph.operators):
        found = [d for d in map(first_variable, ops) if d is not None]
        if found:
            return max(dict.fromkeys(found), key=found.count)
    return graph.tensors[graph.inputs[0]].dtype if graph.inputs else "unknown"


def infer_quantization(graph: Graph) -> str:
    """Names the quantization mode of a graph from its tensors: the activation dtype and the weights'.

    ``float16`` for float16 weights; ``dynamic`` for float activations with int8 weights;
    ``float32``; ``int8`` for int8 activations; ``int16x8`` for int16 activations with int8
    weights; otherwise ``"<activations> activations, <weights> weights"`` (e.g. an int16 audio
    front end of TFLM Signal ops).
    """
    act, weights = activation_dtype(graph), set(weight_dtypes(graph))
    if "float16" in weights:
        return "float16"
    if act in _FLOAT:
        return "dynamic" if weights & {"int8", "int4"} else "float32"
    if act == "int8" and weights <= {"int8", "int4"}:
        return "int8"
    if act == "int16" and weights and weights <= {"int8", "int4"}:
        return "int16x8"
    return f"{act} activations, {'/'.join(sorted(weights)) or 'no'} weights"


def verify_int8(artifact: TFLiteArtifact) -> None:
    """Raises :class:`QuantizationError` unless every input, output and activation is integer.

    A full-integer model for a microcontroller must take int8, give int8, and run only integer
    kernels; the converter silently keeps float inputs, outputs or ops in several cases.
    """
    graph = artifact.graph
    problems = []
    for kind, indices in (("input", graph.inputs), ("output", graph.outputs)):
        for i in indices:
            t = graph.tensors[i]
            if t.dtype != "int8":
                problems.append(f"{kind} {t.name!r} is {t.dtype}")
    for op in graph.operators:
        floats = sorted({graph.tensors[i].dtype for i in (*op.inputs, *op.outputs)
                         if i >= 0 and graph.tensors[i].dtype in _FLOAT})
        if floats:
            problems.append(f"op {op.index} {op.op} uses {'/'.join(floats)} tensors")
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise QuantizationError(
            f"The model is not fully int8: {shown}. Convert with quantization='int8' and representative "
            f"data that covers the input range; replace layers without int8 kernels.")
