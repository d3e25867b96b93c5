"""Child process that tries a TFLM model with arena sizes read from stdin.

The TFLM Python interpreter can crash its process (SIGSEGV) when the arena is far too small,
and after one failed allocation the next interpreter in the same process fails too. So this
worker loads tflite-micro and the model once, then forks a fresh process for every probe: a
crash or a spoiled state dies with that probe. Protocol: the model path is ``argv[1]``; each
stdin line is an arena size (``<size> alloc`` also asks for TFLM's allocation report); each
reply line is ``ok [report]`` or ``fail <message>``, where the
message is what TFLM printed to stderr (or the signal that killed the probe). Imports only
tflite-micro and numpy.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile

__all__: list[str] = []


def _probe(data: bytes, size: int, result_fd: int, allocations: bool = False) -> None:
    """Runs in the forked probe: allocate, invoke once on zeros, report through ``result_fd``.

    With ``allocations``, a successful probe also returns TFLM's RecordingMicroAllocator report.
    """
    import numpy as np
    from tflite_micro.python.tflite_micro import runtime

    log = tempfile.TemporaryFile()
    os.dup2(log.fileno(), 2)  # TFLM reports through fd 2
    try:
        interpreter = runtime.Interpreter.from_bytes(data, arena_size=size)
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


def main() -> int:
    from tflite_micro.python.tflite_micro import runtime  # noqa: F401  (loaded once, inherited by forks)

    with open(sys.argv[1], "rb") as handle:
        data = handle.read()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        size_text, _, flag = line.partition(" ")
        size = int(size_text)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # probe process
            os.close(read_fd)
            try:
                _probe(data, size, write_fd, allocations=flag == "alloc")
            finally:
                os._exit(0)
        os.close(write_fd)
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
        reply = b"".join(chunks).decode(errors="replace")
        if not reply:
            if os.WIFSIGNALED(status):
                reply = f"fail TFLM crashed with {signal.Signals(os.WTERMSIG(status)).name}"
            else:
                reply = f"fail TFLM probe exited with status {os.WEXITSTATUS(status)}"
        sys.stdout.write(" ".join(reply.split()) + "\n")  # one line, whatever TFLM printed
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
