"""Validation on the TFLite Micro interpreter: op support, arena, and agreement with TFLite and Keras.

The interpreter is the one from the ``tflite-micro`` package
(``tflite_micro.python.tflite_micro.runtime``), i.e. the real TFLM kernels and allocator.

The smallest arena is found by asking TFLM itself: a bisection over ``arena_bytes`` in a child
process (a far too small arena can crash the TFLM Python interpreter), each probe allocating
the tensors and running one inference. The result is exact to the byte for the TFLM Python
interpreter: it runs the model with the reported arena and fails with one byte less.

What the number means for a firmware: the Python interpreter allocates through TFLM's
``RecordingMicroAllocator``, which keeps its own records inside the arena. A firmware built with
TFLM's plain ``MicroInterpreter`` (its default ``MicroAllocator``) needs a little less: 240 to
424 bytes less for the models measured on a 64-bit host (a 32-bit microcontroller's smaller
pointers save more). So the reported arena is a safe size to declare in a firmware, not its
exact minimum; :data:`ARENA_ALLOCATOR` and :data:`ARENA_NOTE` say so wherever it is reported.

Example:
    >>> report = tensorfleet.edge.validate_micro(artifact, x_test[:50], y_test[:50])  # doctest: +SKIP
    >>> report.arena_bytes, report.micro_accuracy, report.within_one_step_of_tflite   # doctest: +SKIP
    (3712, 0.96, True)
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import numpy as np

from tensorfleet.edge._arena_worker import PROBE_SECONDS, TIMED_OUT
from tensorfleet.edge.artifact import TFLiteArtifact
from tensorfleet.edge.errors import ArenaTooSmallError, MicroIncompatibleError, UnsupportedOpError
from tensorfleet.edge.ops import interpreter_lacks, start_worker, stop_group, with_advice
from tensorfleet.validation import integer, renamed

__all__ = ["ARENA_ALLOCATOR", "ARENA_NOTE", "MAX_ARENA_BYTES", "MicroValidation", "arena_allocations",
           "check_micro_compatible", "find_arena_size", "probe_arena",
           "run_micro", "run_tflite", "validate_micro", "ArenaProber"]

# The largest arena tensorfleet asks TFLM for: 64 MiB is far beyond any microcontroller's RAM, and
# much larger values crash the TFLM Python interpreter (SIGSEGV, std::bad_alloc) or overflow the
# ``unsigned int`` constant of the exported header.
MAX_ARENA_BYTES = 64 * 1024 * 1024

# Which allocator the measured arena is for, and what that means for a firmware (see the module docstring).
ARENA_ALLOCATOR = "TFLM Python interpreter's RecordingMicroAllocator"
ARENA_NOTE = ("smallest arena with which the TFLM Python interpreter runs the model; its RecordingMicroAllocator "
              "keeps its records in the arena, so a firmware with TFLM's plain MicroAllocator needs a little less "
              "(240-424 bytes less as measured on a 64-bit host): a safe size to declare, not the firmware's minimum")


def check_micro_compatible(artifact: TFLiteArtifact) -> None:
    """Raises if TFLM cannot run the model: ops its interpreter does not register, hybrid ops, float16
    tensors, an int8 softmax of too small a scale.

    Raises:
        UnsupportedOpError: operators the installed TFLM interpreter has no kernel for (asked of the
            interpreter, see :func:`~tensorfleet.edge.ops.interpreter_lacks`), named, with what to do.
        MicroIncompatibleError: dynamic-range (hybrid) ops or float16 weights.
    """
    graph = artifact.graph
    missing = interpreter_lacks([(op.op, op.custom) for op in graph.operators])
    if missing:
        raise UnsupportedOpError(
            f"TFLite Micro has no kernel for {len(missing)} operator(s) of this model: {with_advice(missing)}.",
            missing)
    half = [t.name for t in graph.tensors if t.dtype == "float16"]
    if half:
        raise MicroIncompatibleError(
            f"The model stores {len(half)} tensor(s) as float16 (e.g. {half[0]!r}); TFLite Micro has no "
            f"float16 kernels and cannot dequantize them. Convert with quantization='int8' (or 'float32').")
    hybrid = []
    for op in graph.operators:
        ins = [graph.tensors[i] for i in op.inputs if i >= 0]
        if any(t.dtype == "float32" and not t.is_constant for t in ins) and any(
                t.dtype == "int8" and t.is_constant for t in ins):
            hybrid.append(f"{op.op} #{op.index}")
    for op in graph.operators:
        # TFLM's int8 softmax needs input_scale * 2**26 > 1 (QuantizeMultiplierGreaterThanOne
        # in CalculateSoftmaxParams); below that it aborts the process instead of failing.
        if op.op == "SOFTMAX" and op.inputs:
            t = graph.tensors[op.inputs[0]]
            if t.dtype == "int8" and t.scales and t.scales[0] * 2.0**26 <= 1.0:
                raise MicroIncompatibleError(
                    f"The int8 SOFTMAX #{op.index} has input scale {t.scales[0]:.3g}, below TFLite Micro's "
                    f"minimum of 2**-26 (1.49e-08): its logits span almost nothing, typical of an untrained "
                    f"or collapsed model. Train the model (or check the representative data) and convert again.")
    if hybrid:
        raise MicroIncompatibleError(
            f"The model has dynamic-range (hybrid) ops with float activations and int8 weights: "
            f"{', '.join(hybrid[:5])}{' ...' if len(hybrid) > 5 else ''}. TFLite Micro has no hybrid kernels; "
            f"convert with quantization='int8' and representative data.")


class ArenaProber:
    """Runs arena probes for one model in a child process (which forks one process per probe).

    Example:
        >>> with ArenaProber(artifact.data) as prober:        # doctest: +SKIP
        ...     prober.probe(4096)
        (True, '')
    """

    def __init__(self, data: bytes) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="tensorfleet-arena-")
        self._path = os.path.join(self._dir.name, "model.tflite")
        with open(self._path, "wb") as handle:
            handle.write(data)
        self._proc: subprocess.Popen[str] | None = None
        self.crashes = 0

    def _start(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = start_worker(self._path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)
        return self._proc

    @renamed(arena_size="arena_bytes")
    def probe(self, arena_bytes: int, *, allocations: bool = False) -> tuple[bool, str]:
        """Whether TFLM allocates and runs the model with ``arena_bytes`` of arena, and its message
        (with ``allocations``, a successful probe's message is TFLM's allocation report)."""
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(f"{int(arena_bytes)}{' alloc' if allocations else ''}\n")
            proc.stdin.flush()
            reply = proc.stdout.readline()
        except BrokenPipeError:
            reply = ""
        if not reply:  # the worker itself died (it should not: probes run in its forks)
            proc.wait()
            self.crashes += 1
            self._proc = None
            raise RuntimeError(f"The TFLM arena worker exited with status {proc.returncode} "
                               f"while probing arena_bytes={arena_bytes}.")
        reply = reply.rstrip("\n")
        if reply.startswith(TIMED_OUT):  # neither a yes nor a no about this arena size
            raise RuntimeError(f"TFLite Micro did not finish allocating and running the model within "
                               f"{PROBE_SECONDS} s (arena_bytes={arena_bytes}); its probe was stopped. "
                               "The machine may be overloaded: try again")
        if reply == "ok" or reply.startswith("ok "):
            return True, reply[3:]
        return False, reply[5:]

    def close(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(Exception):
                assert self._proc.stdin is not None
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stop_group(self._proc)
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._proc = None
        self._dir.cleanup()

    def __enter__(self) -> ArenaProber:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@renamed(arena_size="arena_bytes")
def probe_arena(artifact: TFLiteArtifact, arena_bytes: int) -> tuple[bool, str]:
    """Whether TFLM runs ``artifact`` with exactly ``arena_bytes`` of arena (one child process)."""
    with ArenaProber(artifact.data) as prober:
        return prober.probe(arena_bytes)


_ALLOC_LINE = re.compile(r"Arena allocation (total|head|tail) (\d+) bytes|'([^']+)' used (\d+) bytes")


@renamed(arena_size="arena_bytes")
def arena_allocations(artifact: TFLiteArtifact, arena_bytes: int) -> dict[str, int]:
    """TFLM's own account of the arena (RecordingMicroAllocator) when run with ``arena_bytes``.

    Keys: ``total``, ``head`` (the planned, reused activation buffers), ``tail`` (persistent
    data), and one per allocation kind (e.g. ``TfLiteEvalTensor data``). The smallest working
    arena can exceed ``total`` (sine model: 1,936 vs 1,536 bytes): TFLM needs some room that its
    recorder does not count while it plans.
    """
    with ArenaProber(artifact.data) as prober:
        ok, report = prober.probe(arena_bytes, allocations=True)
    if not ok:
        raise ArenaTooSmallError(f"TFLite Micro cannot run the model with arena_bytes={arena_bytes}: {report}",
                                 find_arena_size(artifact, progress=False), arena_bytes)
    out: dict[str, int] = {}
    for match in _ALLOC_LINE.finditer(report):
        if match.group(1):
            out[match.group(1)] = int(match.group(2))
        else:
            out[match.group(3)] = int(match.group(4))
    return out


def find_arena_size(artifact: TFLiteArtifact, *, progress: bool = True) -> int:
    """The smallest ``arena_bytes`` with which the TFLM Python interpreter allocates and runs
    the model (its RecordingMicroAllocator); a plain TFLM C++ build needs a little less (see :data:`ARENA_NOTE`).

    Raises:
        UnsupportedOpError / MicroIncompatibleError: the model cannot run on TFLM at all.
        RuntimeError: TFLM fails even with a 64 MiB arena (its message is included).
    """
    check_micro_compatible(artifact)
    from tqdm.auto import tqdm

    with ArenaProber(artifact.data) as prober, tqdm(desc="arena search", unit="probe", disable=not progress,
                                                    leave=False) as bar:
        hi = 1024
        while True:
            ok, message = prober.probe(hi)
            bar.update()
            if ok:
                break
            if hi >= MAX_ARENA_BYTES:
                raise RuntimeError(f"TFLite Micro cannot run the model even with a {MAX_ARENA_BYTES}-byte arena: "
                                   f"{message}")
            hi *= 4
        lo = hi // 4 if hi > 1024 else 0  # largest size known (or assumed) to fail
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok, _ = prober.probe(mid)
            bar.update()
            if ok:
                hi = mid
            else:
                lo = mid
        return hi


@contextlib.contextmanager
def _quiet_fd2() -> Iterator[None]:
    """Silences what TFLM's C++ code prints on fd 2 while the in-process interpreter runs."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _as_batch(samples: Any, artifact: TFLiteArtifact) -> np.ndarray:
    x = np.asarray(samples, dtype=np.float32)
    expected = tuple(artifact.inputs[0].shape[1:])
    if x.ndim != len(expected) + 1 or tuple(x.shape[1:]) != expected:
        raise ValueError(f"samples must have shape (n, {', '.join(map(str, expected))}) to match the model's "
                         f"input. Received: shape={x.shape}")
    if len(x) == 0:
        raise ValueError("samples must hold at least one sample. Received: 0 samples")
    return x


@renamed(arena_size="arena_bytes")
def run_micro(artifact: TFLiteArtifact, samples: Any, *, arena_bytes: int, progress: bool = True) -> np.ndarray:
    """Raw outputs of the TFLM interpreter for each sample (float samples are quantized first)."""
    from tflite_micro.python.tflite_micro import runtime
    from tqdm.auto import tqdm

    integer("arena_bytes", arena_bytes, minimum=1, maximum=MAX_ARENA_BYTES)
    x = _as_batch(samples, artifact)
    with _quiet_fd2():
        interpreter = runtime.Interpreter.from_bytes(artifact.data, arena_size=int(arena_bytes))
    outputs = []
    for sample in tqdm(x, desc="TFLM", unit="sample", disable=not progress, leave=False):
        interpreter.set_input(artifact.quantize_input(sample[None, ...]), 0)
        interpreter.invoke()
        outputs.append(np.array(interpreter.get_output(0))[0])
    return np.stack(outputs)


def run_tflite(artifact: TFLiteArtifact, samples: Any) -> np.ndarray:
    """Raw outputs of the desktop TFLite interpreter for each sample.

    The interpreter is LiteRT's (``ai_edge_litert``) on the current track and ``tflite_runtime`` on the
    tff track (:mod:`tensorfleet.compat.litert` picks it). It runs TFLite's reference kernels
    (``OpResolverType.BUILTIN_REF``), which TFLM's kernels are ports of; the default optimized kernels and
    XNNPACK round some int8 results differently (measured: 4 of 200 digits outputs off by one).
    """
    from tensorfleet.compat.litert import reference_interpreter

    x = _as_batch(samples, artifact)
    interpreter = reference_interpreter(artifact.data)
    inp = interpreter.get_input_details()[0]["index"]
    out = interpreter.get_output_details()[0]["index"]
    outputs = []
    for sample in x:
        interpreter.set_tensor(inp, artifact.quantize_input(sample[None, ...]))
        interpreter.invoke()
        outputs.append(np.array(interpreter.get_tensor(out))[0])
    return np.stack(outputs)


@dataclass
class MicroValidation:
    """What :func:`validate_micro` found. Accuracies are fractions in [0, 1]; drops are in points."""

    quantization: str
    model_bytes: int
    arena_bytes: int  # for the allocator named by arena_allocator; see ARENA_NOTE
    ops: list[str]
    num_samples: int = 0
    # TFLM against the desktop TFLite interpreter (reference kernels), on the raw outputs: for integer
    # outputs the differences are in quantization steps. TFLite 2.14 agreed with TFLM bit for bit; LiteRT
    # and TFLite 2.21 differ by one step in a few int8 outputs (0.1-0.3% of the digits CNNs' outputs).
    tflite_interpreter: str | None = None
    bit_identical: bool | None = None
    mismatched_elements: int | None = None
    compared_elements: int | None = None
    equal_fraction_vs_tflite: float | None = None
    max_abs_diff_vs_tflite: float | None = None
    within_one_step_of_tflite: bool | None = None
    micro_accuracy: float | None = None
    keras_accuracy: float | None = None
    accuracy_drop_points: float | None = None
    agreement_with_keras: float | None = None
    mean_abs_error_vs_keras: float | None = None
    notes: list[str] = field(default_factory=list)
    arena_allocator: str = ARENA_ALLOCATOR

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def tflite_agreement(self) -> str:
        """One line: how TFLM's raw outputs compare with the desktop TFLite interpreter's ("" without samples)."""
        if self.bit_identical is None or self.mismatched_elements is None or self.equal_fraction_vs_tflite is None:
            return ""
        total = self.compared_elements or 0
        head = f"{self.num_samples} samples: TFLM vs {self.tflite_interpreter} (reference kernels): "
        if self.bit_identical:
            return head + "bit-identical"
        equal = (f"{total - self.mismatched_elements:,} of {total:,} outputs equal "
                 f"({100 * self.equal_fraction_vs_tflite:.1f}%)") if total else ""
        if self.within_one_step_of_tflite is not None:
            steps = "within one quantization step" if self.within_one_step_of_tflite else \
                f"up to {self.max_abs_diff_vs_tflite:g} quantization steps apart"
            return head + f"{steps}, {equal}"
        return head + f"{equal}, max abs diff {self.max_abs_diff_vs_tflite:.3g}"


@renamed(arena_size="arena_bytes")
def validate_micro(artifact: TFLiteArtifact, samples: Any = None, labels: Any = None, *,
                   keras_model: Any = None, arena_bytes: int | None = None, progress: bool = True
                   ) -> MicroValidation:
    """Runs ``artifact`` on the TFLite Micro interpreter and checks it against TFLite and Keras.

    Args:
        artifact: a converted model (from :func:`tensorfleet.edge.convert` or a ``.tflite`` file).
        samples: float inputs shaped like the model input; without them only op support and the
            arena are checked.
        labels: class ids for ``samples``; gives the TFLM and Keras accuracies and the drop.
        keras_model: the float model to compare with (defaults to ``artifact.source_model``).
        arena_bytes: the arena the target has; smaller than needed raises ArenaTooSmallError.

    Returns:
        A :class:`MicroValidation`: smallest arena (of the Python interpreter's recording
        allocator, a safe size for a firmware: see :data:`ARENA_NOTE`), agreement with the desktop TFLite
        interpreter (for integer models: within one quantization step, equal in all outputs with
        ``tflite_runtime`` 2.14 and in 99.7-99.9% with LiteRT, as measured on digits CNNs), accuracy and its drop
        against Keras.

    Raises:
        UnsupportedOpError: ops TFLM lacks, by name.
        MicroIncompatibleError: hybrid (dynamic-range) ops or float16 weights.
        ArenaTooSmallError: ``arena_bytes`` below the smallest arena that works (``required`` says it).

    Example:
        >>> v = validate_micro(artifact, split.x_test, split.y_test)   # doctest: +SKIP
        >>> v.within_one_step_of_tflite, v.accuracy_drop_points         # doctest: +SKIP
        (True, 0.3)
    """
    if not isinstance(artifact, TFLiteArtifact):
        raise TypeError(f"artifact must be a TFLiteArtifact. Received: {type(artifact).__name__}")
    integer("arena_bytes", arena_bytes, minimum=1, maximum=MAX_ARENA_BYTES, optional=True)
    x = None if samples is None else _as_batch(samples, artifact)
    y = _checked_labels(x, labels)
    required = find_arena_size(artifact, progress=progress)
    if arena_bytes is not None and arena_bytes < required:
        raise ArenaTooSmallError(
            f"The tensor arena is too small: the model needs at least {required} bytes "
            f"({required / 1024:.1f} KiB). Received: arena_bytes={arena_bytes}", required, arena_bytes)
    result = MicroValidation(artifact.quantization, artifact.size, required, list(artifact.ops))
    if x is None:
        return result
    result.num_samples = len(x)
    micro_raw = run_micro(artifact, x, arena_bytes=arena_bytes or required, progress=progress)
    tflite_raw = run_tflite(artifact, x)
    from tensorfleet.compat.litert import interpreter_source

    result.tflite_interpreter = interpreter_source()
    _compare_with_tflite(result, micro_raw, tflite_raw)
    micro = artifact.dequantize_output(micro_raw)
    if y is not None:
        result.micro_accuracy = float(np.mean(np.argmax(micro, axis=-1) == y))
    _compare_with_keras(result, keras_model if keras_model is not None else artifact.source_model, x, micro, y)
    return result


def _checked_labels(x: np.ndarray | None, labels: Any) -> np.ndarray | None:
    if labels is None:
        return None
    if x is None:
        raise ValueError("labels were given without samples; pass the samples they label.")
    y = np.asarray(labels).reshape(-1)
    if len(y) != len(x):
        raise ValueError(f"labels must have one entry per sample ({len(x)}). Received: {len(y)} labels")
    return y


def _compare_with_tflite(result: MicroValidation, micro_raw: np.ndarray, tflite_raw: np.ndarray) -> None:
    diff = np.abs(micro_raw.astype(np.float64) - tflite_raw.astype(np.float64))
    result.max_abs_diff_vs_tflite = float(diff.max())
    result.bit_identical = bool(np.array_equal(micro_raw, tflite_raw))
    result.mismatched_elements = int(np.count_nonzero(micro_raw != tflite_raw))
    result.compared_elements = int(micro_raw.size)
    result.equal_fraction_vs_tflite = 1.0 - result.mismatched_elements / micro_raw.size
    if np.issubdtype(micro_raw.dtype, np.integer):
        result.within_one_step_of_tflite = result.max_abs_diff_vs_tflite <= 1.0


def _compare_with_keras(result: MicroValidation, keras_model: Any, x: np.ndarray, micro: np.ndarray,
                        y: np.ndarray | None) -> None:
    if keras_model is not None:
        reference = np.asarray(keras_model.predict(x, verbose=0, batch_size=256), dtype=np.float32)
        if reference.shape != micro.shape:
            result.notes.append(f"Keras output shape {reference.shape} differs from TFLM's {micro.shape}")
        else:
            result.mean_abs_error_vs_keras = float(np.mean(np.abs(reference - micro)))
            if reference.ndim == 2 and reference.shape[1] > 1:
                result.agreement_with_keras = float(np.mean(np.argmax(reference, -1) == np.argmax(micro, -1)))
            if y is not None:
                result.keras_accuracy = float(np.mean(np.argmax(reference, axis=-1) == y))
                assert result.micro_accuracy is not None  # validate_micro sets it whenever labels are given
                result.accuracy_drop_points = 100.0 * (result.keras_accuracy - result.micro_accuracy)
    elif y is not None:
        result.notes.append("no Keras model to compare with: pass keras_model= for the accuracy drop")
