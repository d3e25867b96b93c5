"""What a person sees of TensorFlow's output: its known noise left out, progress bars one line each.

TensorFlow prints lines on every start that say nothing to a user, and the environment
cannot turn them off without hiding real errors too:

* TensorFlow 2.14: ``E ... cuda_dnn.cc] Unable to register cuDNN factory`` (and cuFFT, cuBLAS):
  XLA's stream executor logs them at ERROR when TensorFlow's libraries register their CUDA
  plugins twice while ``import tensorflow`` runs, GPU or not. ``TF_CPP_MIN_LOG_LEVEL=2`` keeps
  them (it hides INFO and WARNING only); ``3`` hides them with every other C++ error.
* TensorFlow 2.21 logs through absl before its log level is read, so ``TF_CPP_MIN_LOG_LEVEL``
  does not reach these: ``WARNING: All log messages before absl::InitializeLog() is called are
  written to STDERR``, ``I... port.cc:153] oneDNN custom operations are on ...``, ``I...
  cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.``, and
  at ERROR ``E... cuda_platform.cc:52] failed call to cuInit: ... UNKNOWN ERROR (303)`` (no CUDA
  driver library; a driver that fails for another reason is still shown). With a lower log
  level also ``cpu_feature_guard.cc`` (which CPU instructions the binary could use), two lines.
* ``fully_quantize: 0, inference_type: 6, ...``: the TFLite quantizer writes it straight to
  stderr on every full-integer conversion; no log level reaches it.
* TFLite's ``UserWarning: Statistics for quantized inputs were expected, but not specified``,
  raised for every full-integer conversion with a representative dataset (the statistics it
  asks for are the other way to calibrate).

:func:`is_noise` recognises them (:data:`NOISE`). :func:`quiet_stderr` filters this
process's own stderr at the file descriptor, where C++ writes too, passing everything else
through as written; the launcher leaves them out of its tasks' output. Both are what
``tensorfleet`` does without ``--verbose``.

:class:`ProgressLines` turns a task's output stream into lines: Keras' progress bar (one
``\\r``-separated update every 0.05 s, all on one line until the epoch ends) becomes the bar's
state at most every ``interval`` seconds plus its final state, each a line of its own.

Example:
    >>> is_noise("2026-11-23 14:20:22.950483: E tensorflow/compiler/xla/stream_executor/cuda/cuda_fft.cc:609] "
    ...          "Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT when one "
    ...          "has already been registered")
    True
    >>> progress = ProgressLines(interval=1.0)
    >>> progress.feed("1/3 [==>...]\\b\\b\\r2/3 [====>.]\\b\\b\\r3/3 [======] - loss: 0.5\\n", now=0.0)
    [('3/3 [======] - loss: 0.5', True)]
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import sys
import threading
import warnings
from typing import Iterator

__all__ = ["NOISE", "ProgressLines", "is_noise", "quiet_stderr"]

# The head of a C++ log line: TensorFlow 2.14's "2026-11-23 14:20:22.950483: E path/file.cc:609] ",
# or absl's (TensorFlow 2.21) "E0000 00:00:1795791305.987977    7002 file.cc:52] ".
_LOG = (r"(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ )"
        r"(?:\S*/)?")

#: Lines TensorFlow prints that are noise to a user (see the module docstring).
NOISE: tuple[re.Pattern[str], ...] = (
    re.compile(rf"^{_LOG}cuda_(dnn|fft|blas)\.cc:\d+\] "
               r"Unable to register cu(DNN|FFT|BLAS) factory: Attempting to register factory for plugin "
               r"cu(DNN|FFT|BLAS) when one has already been registered$"),
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"),
    re.compile(rf"^{_LOG}port\.cc:\d+\] oneDNN custom operations are on\. You may see slightly different "
               r"numerical results due to floating-point round-off errors from different computation orders\. "
               r"To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`\.$"),
    re.compile(rf"^{_LOG}cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used\.$"),
    re.compile(rf"^{_LOG}cuda_(platform|driver)\.cc:\d+\] failed call to cuInit: "
               r"(INTERNAL: CUDA error: Failed call to cuInit: )?UNKNOWN ERROR \(303\)$"),
    re.compile(rf"^{_LOG}cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available CPU "
               r"instructions in performance-critical operations\.$"),
    re.compile(r"^To enable the following instructions: [A-Za-z0-9_ ]+, in other operations, rebuild "
               r"TensorFlow with the appropriate compiler flags\.$"),
    re.compile(r"^fully_quantize: \d+, inference_type: \d+, input_inference_type: \w+, "
               r"output_inference_type: \w+$"),
    # the profiler client's line for each task a coordinator traces (tf.profiler.experimental.client.trace)
    re.compile(r"^Starting to trace for \d+ ms\. Remaining attempt\(s\): \d+$"),
)
_WARNINGS = (r"Statistics for quantized inputs were expected, but not specified; continuing anyway\.",)
_IDLE = 0.05  # seconds a line without its end waits before it is passed on as it is


def is_noise(line: str) -> bool:
    """Whether ``line`` (without its line end) is one of TensorFlow's lines in :data:`NOISE`."""
    return any(pattern.match(line) for pattern in NOISE)


@contextlib.contextmanager
def quiet_stderr(enabled: bool = True) -> Iterator[None]:
    """Leaves :data:`NOISE` out of this process's stderr (C++ writes included) while inside.

    File descriptor 2 goes through a pipe; a thread copies it to the real stderr, line by line
    (``\\n`` or ``\\r``, so progress bars stay live), dropping the lines :func:`is_noise` knows.
    A line still without its end after 50 ms is passed on as it is. TFLite's calibration warning
    is ignored too. ``enabled=False`` changes nothing (``--verbose``).
    """
    try:
        saved = os.dup(2) if enabled else -1
    except OSError:  # no stderr at all (closed by the caller): nothing to filter
        saved = -1
    if saved < 0:
        yield
        return
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    pump = threading.Thread(target=_pump, args=(read_end, saved), name="tensorfleet-stderr", daemon=True)
    pump.start()
    try:
        with warnings.catch_warnings():
            for message in _WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer here is gone: the pump sees its end
        pump.join(timeout=2.0)  # a child still holding the pipe keeps it open; do not wait for it
        if not pump.is_alive():  # else it still writes there: closing could hand the number to another file
            os.close(saved)


def _pump(read_end: int, out: int) -> None:
    pending = b""
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], _IDLE if pending else None)
            if not ready:  # a line without its end for a while: pass it on as it is
                _write(out, pending)
                pending = b""
                continue
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            pending += chunk
            pieces = re.split(rb"(?<=[\r\n])", pending)
            pending = pieces.pop()  # the last piece has no line end yet
            _write(out, b"".join(p for p in pieces if not is_noise(p.rstrip(b"\r\n").decode("utf-8", "replace"))))
        _write(out, pending)
    finally:
        os.close(read_end)


def _write(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except OSError:
            return


class ProgressLines:
    """Splits a stream of output into lines for people, with carriage-return progress collapsed.

    :meth:`feed` takes the next text of the stream and returns ``(line, complete)`` pairs:
    every line ended by ``\\n`` as its final state (the text after its last ``\\r``, without
    ``\\b``), and, at most once every ``interval`` seconds, the current state of a line still
    being redrawn (``complete=False``). A line without an end that grows past ``limit``
    characters is passed on in pieces.
    """

    def __init__(self, *, interval: float = 2.0, limit: int = 65536) -> None:
        self.interval = interval
        self.limit = limit
        self._pending = ""
        self._shown_at: float | None = None
        self._shown = ""

    @staticmethod
    def _state(text: str) -> str:
        segments = [s.rstrip() for s in text.replace("\b", "").split("\r")]
        return next((s for s in reversed(segments) if s), "")

    def feed(self, text: str, *, now: float) -> list[tuple[str, bool]]:
        """The lines ``text`` completes, and the current progress state when it is due."""
        out: list[tuple[str, bool]] = []
        self._pending += text
        while "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            out.append((self._state(line), True))
            self._shown_at, self._shown = None, ""
        while len(self._pending) > self.limit and "\r" not in self._pending:
            out.append((self._pending[: self.limit], True))
            self._pending = self._pending[self.limit:]
        if "\r" in self._pending:
            state = self._state(self._pending)
            tail = self._pending[self._pending.rindex("\r") + 1:]
            # Earlier states are done with; keep the last one for a "\n" that may end it.
            self._pending = "\r" + tail if tail.replace("\b", "").strip() else f"\r{state}\r"
            due = self._shown_at is None or now - self._shown_at >= self.interval
            if state and state != self._shown and due:
                out.append((state, False))
                self._shown_at, self._shown = now, state
        return out

    def flush(self) -> list[tuple[str, bool]]:
        """What is left when the stream ends (a last line without ``\\n``)."""
        state, self._pending = self._state(self._pending), ""
        return [(state, True)] if state else []
