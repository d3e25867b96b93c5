"""The operators TFLite Micro has kernels for: what the installed interpreter registers, and the
``MicroMutableOpResolver`` method that registers each in a firmware.

Whether TFLM can run an operator is asked of the installed ``tflite-micro`` interpreter itself
(:func:`interpreter_lacks`: its op resolver is consulted with a one-operator model in a child
process). The tables below map each operator to the ``Add*`` method of
``tflite::MicroMutableOpResolver`` (tensorflow/lite/micro/micro_mutable_op_resolver.h) that a
firmware calls to register it; they cover exactly what the installed interpreter registers
(a test compares them), plus ``ethos-u``, which only Arm Ethos-U builds of TFLM have. Custom
operators include TFLM's Signal library (``SignalWindow``, ``SignalRfft``, ...), which its audio
front ends use.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tensorfleet.edge._arena_worker import PROBE_SECONDS

__all__ = ["MICRO_OPS", "MICRO_CUSTOM_OPS", "safe_python", "interpreter_lacks", "unsupported_ops", "advice",
           "with_advice"]

MICRO_OPS: dict[str, str] = {
    "ABS": "AddAbs", "ADD": "AddAdd", "ADD_N": "AddAddN", "ARG_MAX": "AddArgMax", "ARG_MIN": "AddArgMin",
    "ASSIGN_VARIABLE": "AddAssignVariable", "AVERAGE_POOL_2D": "AddAveragePool2D",
    "BATCH_MATMUL": "AddBatchMatMul", "BATCH_TO_SPACE_ND": "AddBatchToSpaceNd",
    "BROADCAST_ARGS": "AddBroadcastArgs", "BROADCAST_TO": "AddBroadcastTo", "CALL_ONCE": "AddCallOnce",
    "CAST": "AddCast", "CEIL": "AddCeil", "CONCATENATION": "AddConcatenation", "CONV_2D": "AddConv2D",
    "COS": "AddCos", "CUMSUM": "AddCumSum", "DEPTHWISE_CONV_2D": "AddDepthwiseConv2D",
    "DEPTH_TO_SPACE": "AddDepthToSpace", "DEQUANTIZE": "AddDequantize", "DIV": "AddDiv",
    "DYNAMIC_UPDATE_SLICE": "AddDynamicUpdateSlice", "ELU": "AddElu", "EMBEDDING_LOOKUP": "AddEmbeddingLookup",
    "EQUAL": "AddEqual", "EXP": "AddExp", "EXPAND_DIMS": "AddExpandDims", "FILL": "AddFill",
    "FLOOR": "AddFloor", "FLOOR_DIV": "AddFloorDiv", "FLOOR_MOD": "AddFloorMod",
    "FULLY_CONNECTED": "AddFullyConnected", "GATHER": "AddGather", "GATHER_ND": "AddGatherNd",
    "GREATER": "AddGreater", "GREATER_EQUAL": "AddGreaterEqual", "HARD_SWISH": "AddHardSwish", "IF": "AddIf",
    "L2_NORMALIZATION": "AddL2Normalization", "L2_POOL_2D": "AddL2Pool2D", "LEAKY_RELU": "AddLeakyRelu",
    "LESS": "AddLess", "LESS_EQUAL": "AddLessEqual", "LOG": "AddLog", "LOGICAL_AND": "AddLogicalAnd",
    "LOGICAL_NOT": "AddLogicalNot", "LOGICAL_OR": "AddLogicalOr", "LOGISTIC": "AddLogistic",
    "LOG_SOFTMAX": "AddLogSoftmax", "MAXIMUM": "AddMaximum", "MAX_POOL_2D": "AddMaxPool2D", "MEAN": "AddMean",
    "MINIMUM": "AddMinimum", "MIRROR_PAD": "AddMirrorPad", "MUL": "AddMul", "NEG": "AddNeg",
    "NOT_EQUAL": "AddNotEqual", "PACK": "AddPack", "PAD": "AddPad", "PADV2": "AddPadV2", "PRELU": "AddPrelu",
    "QUANTIZE": "AddQuantize", "READ_VARIABLE": "AddReadVariable", "REDUCE_ALL": "AddReduceAll",
    "REDUCE_MAX": "AddReduceMax",
    "REDUCE_MIN": "AddReduceMin", "RELU": "AddRelu", "RELU6": "AddRelu6", "RESHAPE": "AddReshape",
    "RESIZE_BILINEAR": "AddResizeBilinear", "RESIZE_NEAREST_NEIGHBOR": "AddResizeNearestNeighbor",
    "REVERSE_V2": "AddReverseV2", "ROUND": "AddRound", "RSQRT": "AddRsqrt", "SELECT_V2": "AddSelectV2",
    "SHAPE": "AddShape", "SIN": "AddSin", "SLICE": "AddSlice", "SOFTMAX": "AddSoftmax",
    "SPACE_TO_BATCH_ND": "AddSpaceToBatchNd", "SPACE_TO_DEPTH": "AddSpaceToDepth", "SPLIT": "AddSplit",
    "SPLIT_V": "AddSplitV", "SQRT": "AddSqrt", "SQUARE": "AddSquare",
    "SQUARED_DIFFERENCE": "AddSquaredDifference", "SQUEEZE": "AddSqueeze", "STRIDED_SLICE": "AddStridedSlice",
    "SUB": "AddSub", "SUM": "AddSum", "SVDF": "AddSvdf", "TANH": "AddTanh", "TRANSPOSE": "AddTranspose",
    "TRANSPOSE_CONV": "AddTransposeConv", "UNIDIRECTIONAL_SEQUENCE_LSTM": "AddUnidirectionalSequenceLSTM",
    "UNPACK": "AddUnpack", "VAR_HANDLE": "AddVarHandle", "WHILE": "AddWhile", "ZEROS_LIKE": "AddZerosLike",
}

MICRO_CUSTOM_OPS: dict[str, str] = {
    "CIRCULAR_BUFFER": "AddCircularBuffer",
    "TFLite_Detection_PostProcess": "AddDetectionPostprocess",
    "ethos-u": "AddEthosU",
    "TFLM_DECODE": "AddDecode",  # decompresses tensors of models compressed with TFLM's compression tool
    # TFLM's Signal library (signal/micro/kernels), registered under these names by the resolver.
    "SignalDelay": "AddDelay", "SignalEnergy": "AddEnergy", "SignalFftAutoScale": "AddFftAutoScale",
    "SignalFilterBank": "AddFilterBank", "SignalFilterBankLog": "AddFilterBankLog",
    "SignalFilterBankSpectralSubtraction": "AddFilterBankSpectralSubtraction",
    "SignalFilterBankSquareRoot": "AddFilterBankSquareRoot", "SignalFramer": "AddFramer",
    "SignalIrfft": "AddIrfft", "SignalOverlapAdd": "AddOverlapAdd", "SignalPCAN": "AddPCAN",
    "SignalRfft": "AddRfft", "SignalStacker": "AddStacker", "SignalWindow": "AddWindow",
}

# Registered only by TFLM builds for an Arm Ethos-U NPU; the host interpreter cannot run it.
ETHOS_U = "ethos-u"


def safe_python() -> list[str]:
    """The command that starts a child Python for a worker script of this package.

    ``-P`` (Python 3.11) keeps the working directory and the script's folder off ``sys.path``,
    so a user's ``bisect.py`` or ``random.py`` there cannot shadow the standard library. The
    worker script imports only the standard library, numpy and tflite-micro, never tensorfleet,
    so it runs by path and needs no ``-m``.
    """
    return [sys.executable, "-P", str(Path(__file__).with_name("_arena_worker.py"))]


# What the installed interpreter answered, per (name, is_custom): it cannot change while the process runs.
_REGISTERED: dict[tuple[str, bool], bool] = {}


# How long the op check may go without answering its next question before it counts as hung. The
# check as a whole takes as long as its questions need (about 10 ms each when quiet), so a busy
# machine slows it down without failing it.
_REPLY_SECONDS = 120.0


def _ask_interpreter(ops: list[tuple[str, bool]]) -> list[str]:
    questions = "".join(f"{'custom' if custom else 'builtin'} {name}\n" for name, custom in ops)
    with tempfile.TemporaryFile("w+") as errors, \
            start_worker("--ops", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(questions.encode())  # a few KiB: fits the pipe, and the worker reads it line by line
        proc.stdin.close()
        replies = _replies(proc, len(ops))
        status = proc.wait()
        errors.seek(0)
        detail = errors.read().strip()[-500:]
    if status != 0 or len(replies) != len(ops):
        raise RuntimeError(f"The TFLM op check exited with status {status} after {len(replies)} of "
                           f"{len(ops)} answers: {detail}")
    hung = [name for (name, _), reply in zip(ops, replies) if reply == "timeout"]
    if hung:
        raise RuntimeError(f"TFLM did not answer within {PROBE_SECONDS} s whether it has a kernel for "
                           f"{', '.join(hung)} (asked twice); the machine may be overloaded: try again")
    return [name for (name, _), reply in zip(ops, replies) if reply != "yes"]


def start_worker(*args: str, **popen: Any) -> subprocess.Popen[Any]:
    """The worker script (:func:`safe_python`) with ``args``, in a session of its own so that
    :func:`stop_group` ends it with the probe it may have forked, TensorFlow's logs quiet."""
    return subprocess.Popen([*safe_python(), *args], env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                            start_new_session=True, **popen)


def stop_group(proc: subprocess.Popen[Any]) -> None:
    """Kills a worker started with ``start_new_session=True`` and the probe it may have forked."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _replies(proc: subprocess.Popen[bytes], count: int) -> list[str]:
    """The worker's reply lines, each awaited at most ``_REPLY_SECONDS``; a stalled worker is killed.

    Read unbuffered from the pipe, so that a line already read is never waited for again.
    """
    assert proc.stdout is not None
    fd, pending = proc.stdout.fileno(), b""
    replies: list[str] = []
    while len(replies) < count:
        ready, _, _ = select.select([fd], [], [], _REPLY_SECONDS)
        if not ready:
            stop_group(proc)
            raise RuntimeError(f"The TFLM op check gave no answer for {_REPLY_SECONDS:.0f} s after "
                               f"{len(replies)} of {count}; it was stopped")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        replies += [line.decode().strip() for line in lines]
    return replies


def interpreter_lacks(ops: list[tuple[str, bool]]) -> list[str]:
    """Distinct operators (``(name, is_custom)``) that the installed TFLM interpreter has no
    registration for, in order; asked of the interpreter (one child process for the unknown ones).

    Example:
        >>> interpreter_lacks([("CONV_2D", False), ("TOPK_V2", False), ("SignalWindow", True)])  # doctest: +SKIP
        ['TOPK_V2']
    """
    distinct = list(dict.fromkeys((str(name), bool(custom)) for name, custom in ops))
    unknown = [op for op in distinct if op not in _REGISTERED]
    if unknown:
        missing = set(_ask_interpreter(unknown))
        _REGISTERED.update({(name, custom): name not in missing for name, custom in unknown})
    return [name for name, custom in distinct if not _REGISTERED[(name, custom)]]

# What to do instead, for operators that Keras models commonly produce and TFLM lacks.
_ADVICE: dict[str, str] = {
    "TOPK_V2": "take the arg-max (ARG_MAX) or do the top-k selection in application code",
    "FlexErfV2": "use activation='relu' or a HARD_SWISH approximation instead of exact GELU",
    "GELU": "use relu, or hard_swish, which TFLM has kernels for",
    "RANGE": "make the range a constant of the model",
    "WHERE": "replace data-dependent shapes with masks (SELECT_V2)",
    "NON_MAX_SUPPRESSION_V4": "use the TFLite_Detection_PostProcess custom op",
    "NON_MAX_SUPPRESSION_V5": "use the TFLite_Detection_PostProcess custom op",
    "SCATTER_ND": "express the update with DYNAMIC_UPDATE_SLICE or arithmetic on masks",
    "ATAN2": "approximate with arithmetic ops or move it out of the model",
    ETHOS_U: "it runs only on an Arm Ethos-U NPU build of TFLM; this host interpreter cannot validate it",
}


def advice(op: str) -> str:
    """A suggestion for replacing an operator TFLM lacks."""
    if op.startswith("Flex"):
        return _ADVICE.get(op, "the op is a TensorFlow (Flex) op; TFLM runs only TFLite builtins - "
                                "replace the layer that produces it")
    return _ADVICE.get(op, "replace the layer that produces it with one built from TFLM's builtins, "
                           "or register a custom kernel on the device")


def with_advice(ops: list[str]) -> str:
    """``"OP (what to do instead); ..."`` for operators TFLM lacks, for error messages."""
    return "; ".join(f"{op} ({advice(op)})" for op in ops)


def unsupported_ops(ops: list[tuple[str, bool]] | list[str]) -> list[str]:
    """Distinct operators (``name`` or ``(name, is_custom)``) with no ``MicroMutableOpResolver`` method in
    the tables, in order: what a firmware could not register (the C export's check; whether the
    installed interpreter runs an op is :func:`interpreter_lacks`)."""
    missing: list[str] = []
    for item in ops:
        name, custom = (item, False) if isinstance(item, str) else item
        table = MICRO_CUSTOM_OPS if custom else MICRO_OPS
        if name not in table and name not in missing:
            missing.append(name)
    return missing
