"""Worker processes started ahead: TensorFlow imported, no model yet, waiting to be told which to load.

A replica's process spends most of its start importing TensorFlow (seconds on a small machine);
loading a small SavedModel takes a fraction of that. A :class:`StandbySupply` keeps one process
imported and waiting, so a replica added (above all the first after scaling to zero, a cold
start) costs the model's load and warm-up only. The supply is refilled once the replica that took
its standby is up, so the next import does not compete with that load for the CPU, and the new
standby imports at idle priority (Linux's SCHED_IDLE), so it takes no CPU the replicas want. The process
runs :func:`worker_main`: import, wait, load, replay the warm-up records, answer calls.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from typing import Any

__all__ = ["IMPORTED", "READY", "Standby", "StandbySupply", "worker_main"]

IMPORTED, READY = "imported", "ready"


def _idle_priority(on: bool, pid: int = 0) -> None:
    """Linux's SCHED_IDLE for ``pid`` (0: this process) while ``on`` (it runs only on CPU time nothing
    else wants), else SCHED_OTHER; a process may switch its own user's both ways. Elsewhere, nothing."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(pid, os.SCHED_IDLE if on else os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass


def worker_main(conn: Any, intra_op_threads: int, background: bool = False) -> None:
    """A worker process: import TensorFlow, say so, wait for (name, version, path), load it and
    replay its warm-up records, then answer (signature, arrays) calls until the pipe closes.

    A ``background`` standby imports at idle priority, so that a refill does not take CPU from the
    replicas serving a burst; the load it is then asked for runs at normal priority."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if background:
        _idle_priority(True)
    import tensorflow as tf

    if intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    from tensorfleet.serving.servable import Servable
    from tensorfleet.serving.warmup import replay

    try:
        conn.send((IMPORTED, os.getpid()))
        name, version, path = conn.recv()
    except (EOFError, OSError):
        return
    if background:
        _idle_priority(False)
    began = time.perf_counter()
    servable = Servable(name, version, path)
    loaded = time.perf_counter()
    records = replay(servable)
    conn.send((READY, (records, loaded - began, time.perf_counter() - loaded)))
    while True:
        try:
            signature, arrays = conn.recv()
        except (EOFError, OSError):
            return
        reply: tuple[str, Any]
        try:
            reply = ("ok", servable.run(signature, arrays))
        except Exception as exc:  # the front turns it into the request's error
            reply = ("error", (type(exc).__name__, str(exc), getattr(exc, "error_code", None)))
        conn.send(reply)


class Standby:
    """One started worker process (spawned: TensorFlow's runtime does not survive fork)."""

    def __init__(self, *, intra_op_threads: int = 0, background: bool = False) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=worker_main, args=(child, intra_op_threads, background),
                                       name="tfl-replica", daemon=True)
        self.process.start()
        child.close()
        self.pid: int | None = None

    def imported(self, timeout: float) -> int:
        """Waits until TensorFlow is imported (up to ``timeout``); returns the process id."""
        if self.pid is None:
            if not self.conn.poll(timeout):
                raise RuntimeError(f"A worker process did not import TensorFlow within {timeout:g}s.")
            _, self.pid = self.conn.recv()
        return self.pid

    def stop(self, timeout: float = 10.0) -> None:
        self.conn.close()
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)


class StandbySupply:
    """One :class:`Standby` kept ready for whichever replica pool starts a replica next.

    Example:
        >>> supply = StandbySupply()            # doctest: +SKIP
        >>> supply.wait(120)                     # doctest: +SKIP
        >>> pool = ReplicaPool("digits", 1, "models/digits/1", replicas=0, standby=supply)  # doctest: +SKIP
    """

    def __init__(self, *, intra_op_threads: int = 1) -> None:
        self.intra_op_threads = intra_op_threads
        self._lock = threading.Lock()
        self._closed = False
        self._standby: Standby | None = Standby(intra_op_threads=intra_op_threads)

    def wait(self, timeout: float = 120.0) -> int | None:
        """Blocks until the standby has imported TensorFlow; its process id (None if taken or closed)."""
        with self._lock:
            standby = self._standby
        return None if standby is None else standby.imported(timeout)

    def take(self) -> Standby | None:
        """The standby process, or None when it was just taken (the caller starts a process of its own).
        A standby still importing at idle priority goes on at normal priority: a request waits for it."""
        with self._lock:
            standby, self._standby = self._standby, None
        if standby is not None and standby.pid is None and standby.process.pid:
            _idle_priority(False, standby.process.pid)
        return standby

    def refill(self) -> None:
        """Starts the next standby, unless one is there or the supply is closed."""
        with self._lock:
            if not self._closed and self._standby is None:
                self._standby = Standby(intra_op_threads=self.intra_op_threads, background=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            standby, self._standby = self._standby, None
        if standby is not None:
            standby.stop()
