"""Child process that asks the TFLM Python interpreter about a model, one question per stdin line.

Run as a script (``python -P _arena_worker.py ...``): it imports only the standard library,
numpy and tflite-micro, so it needs no ``sys.path`` entry for tensorfleet, and ``-P`` keeps a
user's ``bisect.py`` in the working directory from shadowing the standard library.

The TFLM Python interpreter can crash its process (SIGSEGV) when the arena is far too small,
and after one failed allocation the next interpreter in the same process fails too. So this
worker loads tflite-micro once, then forks a fresh process for every probe: a crash or a
spoiled state dies with that probe. Two modes:

* ``_arena_worker.py MODEL``: each stdin line is an arena size (``<size> alloc`` also asks for
  TFLM's allocation report); each reply line is ``ok [report]`` or ``fail <message>``, where the
  message is what TFLM printed to stderr (or the signal that killed the probe).
* ``_arena_worker.py --ops``: each stdin line is ``builtin NAME`` or ``custom NAME``; the reply is
  ``yes`` if the interpreter's op resolver has a registration for that operator, else ``no``
  (``timeout`` if its probe hung twice). The
  question is put to TFLM itself: a one-operator model is allocated (not run), and TFLM's "Failed
  to get registration" (or "Didn't find op") means the resolver lacks it.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import tempfile
import time

__all__: list[str] = []

# A probe that has not answered in this long is killed (TFLM allocates and runs a TinyML model on
# zeros in milliseconds; under heavy load, seconds).
PROBE_SECONDS = 120
TIMED_OUT = "fail TFLM probe did not finish within"
_NOT_REGISTERED = ("Failed to get registration from op code", "Didn't find op for")


def _probe(data: bytes, size: int, result_fd: int, allocations: bool = False, run: bool = True) -> None:
    """Runs in the forked probe: allocate, invoke once on zeros, report through ``result_fd``.

    With ``allocations``, a successful probe also returns TFLM's RecordingMicroAllocator report;
    without ``run`` it only allocates (which is where TFLM looks up every operator's kernel).
    """
    import numpy as np
    from tflite_micro.python.tflite_micro import runtime

    log = tempfile.TemporaryFile()
    os.dup2(log.fileno(), 2)  # TFLM reports through fd 2
    try:
        interpreter = runtime.Interpreter.from_bytes(data, arena_size=size)
        if not run:
            os.write(result_fd, b"ok")
            return
        details = interpreter.get_input_details(0)
        interpreter.set_input(np.zeros(details["shape"], details["dtype"]), 0)
        interpreter.invoke()
        interpreter.get_output(0)
        reply = "ok"
        if allocations:
            interpreter.print_allocations()
            os.fsync(2)
            log.seek(0)
            reply += " " + log.read().decode(errors="replace").strip().replace("\n", " | ")
    except Exception as exc:  # TFLM raises RuntimeError with a generic text; its log has the cause
        os.fsync(2)
        log.seek(0)
        detail = log.read().decode(errors="replace").strip().replace("\n", " | ")
        reply = f"fail {type(exc).__name__}: {exc}" + (f" | {detail}" if detail else "")
    os.write(result_fd, reply.encode())


def _forked_probe(data: bytes, size: int, allocations: bool = False, run: bool = True) -> str:
    """:func:`_probe` in a forked child; its reply on one line, or how the child died."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # probe process
        os.close(read_fd)
        try:
            _probe(data, size, write_fd, allocations=allocations, run=run)
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + PROBE_SECONDS
    timed_out = False
    while True:
        ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:  # a probe that hangs is killed rather than left to stall every question after it
            os.kill(pid, signal.SIGKILL)
            timed_out = True
            break
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    reply = b"".join(chunks).decode(errors="replace")
    if timed_out:
        reply = f"{TIMED_OUT} {PROBE_SECONDS} s"
    elif not reply:
        if os.WIFSIGNALED(status):
            reply = f"fail TFLM crashed with {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            reply = f"fail TFLM probe exited with status {os.WEXITSTATUS(status)}"
    return " ".join(reply.split())  # one line, whatever TFLM printed


def one_operator_model(name: str, custom: bool) -> bytes:
    """A TFLite flatbuffer with one float tensor in, one out, and one operator ``name`` between."""
    import flatbuffers
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as fb

    code = fb.OperatorCodeT()
    number = fb.BuiltinOperator.CUSTOM if custom else getattr(fb.BuiltinOperator, name)
    code.builtinCode, code.deprecatedBuiltinCode, code.version = number, min(number, 127), 1
    if custom:
        code.customCode = name
    tensors = []
    for tensor_name in ("in", "out"):
        tensor = fb.TensorT()
        tensor.shape, tensor.type, tensor.buffer, tensor.name = [1], fb.TensorType.FLOAT32, 0, tensor_name
        tensors.append(tensor)
    op = fb.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0], [1]
    subgraph = fb.SubGraphT()
    subgraph.tensors, subgraph.inputs, subgraph.outputs, subgraph.operators = tensors, [0], [1], [op]
    model = fb.ModelT()
    model.version, model.operatorCodes, model.subgraphs, model.buffers = 3, [code], [subgraph], [fb.BufferT()]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _registered(line: str) -> str:
    kind, _, name = line.partition(" ")
    try:
        data = one_operator_model(name, kind == "custom")
    except AttributeError:  # a builtin name this schema does not know
        return "no"
    # Allocation alone: invoking a one-operator model whose options are all unset can loop for
    # minutes (AVERAGE_POOL_2D did, in its float kernel).
    reply = _forked_probe(data, 16 * 1024, run=False)
    if reply.startswith(TIMED_OUT):  # asked once more: a stalled fork says nothing about the resolver
        reply = _forked_probe(data, 16 * 1024, run=False)
    if reply.startswith(TIMED_OUT):
        return "timeout"
    return "no" if any(marker in reply for marker in _NOT_REGISTERED) else "yes"


def main() -> int:
    from tflite_micro.python.tflite_micro import runtime  # noqa: F401  (loaded once, inherited by forks)

    ops_mode = sys.argv[1] == "--ops"
    if not ops_mode:
        with open(sys.argv[1], "rb") as handle:
            data = handle.read()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        if ops_mode:
            reply = _registered(line)
        else:
            size_text, _, flag = line.partition(" ")
            reply = _forked_probe(data, int(size_text), allocations=flag == "alloc")
        sys.stdout.write(reply + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
