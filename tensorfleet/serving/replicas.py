"""Data-parallel serving: N replicas of a model version in worker processes behind one front.

Each replica is a spawned process that loads the SavedModel and answers one call at a time over
a pipe. The front keeps the idle replicas in a queue: a call takes one, sends the (already
checked and batched) arrays, and puts the replica back with the answer. A replica that dies
mid-call (its pipe breaks) is replaced by a fresh process in the background, and the call is
retried on another replica, so no request is lost; the front answers each request once, from the
one reply it accepts. The model runs outside the front's process, so the front's event loop
never waits for the interpreter lock held by a signature call.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from tensorfleet.serving.errors import Code, ServingError
from tensorfleet.validation import integer, positive_int

__all__ = ["Replica", "ReplicaPool"]

_READY = "ready"


def _replica_main(conn: Any, name: str, version: int, path: str, intra_op_threads: int) -> None:
    """A replica process: load the version, then answer (signature, arrays) calls until the pipe closes."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    from tensorfleet.serving.servable import Servable

    servable = Servable(name, version, path)
    conn.send((_READY, os.getpid()))
    while True:
        try:
            signature, arrays = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", servable.run(signature, arrays))
        except Exception as exc:  # the front turns it into the request's error
            reply = ("error", (type(exc).__name__, str(exc), getattr(exc, "error_code", None)))
        conn.send(reply)


class _RemoteError(Exception):
    def __init__(self, kind: str, message: str, error_code: int | None) -> None:
        super().__init__(f"{kind} in replica: {message}")
        self.error_code = error_code
        self.message = f"{kind}: {message}"


class ReplicaDied(Exception):
    """The replica's process ended (or its pipe broke) during a call."""


class Replica:
    """One worker process holding one model version."""

    def __init__(self, index: int, name: str, version: int, path: Path, *, intra_op_threads: int = 0,
                 start_timeout: float = 120.0) -> None:
        self.index = index
        context = multiprocessing.get_context("spawn")  # TensorFlow's runtime does not survive fork
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_replica_main, args=(child, name, version, str(path), intra_op_threads),
                                       name=f"tfl-replica-{name}-{version}-{index}", daemon=True)
        self.process.start()
        child.close()
        if not self._conn.poll(start_timeout):
            self.stop()
            raise RuntimeError(f"Replica {index} of {name!r} v{version} did not load within {start_timeout:g}s.")
        try:
            _, self.pid = self._conn.recv()
        except (EOFError, OSError):
            self.stop()
            raise RuntimeError(f"Replica {index} of {name!r} v{version} exited while loading "
                               f"(exit code {self.process.exitcode}).") from None

    def call(self, signature: str | None, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            self._conn.send((signature, dict(arrays)))
            status, value = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise ReplicaDied(f"replica {self.index} (pid {self.pid}) died: {exc!r}") from None
        if status == "error":
            raise _RemoteError(*value)
        return value

    def alive(self) -> bool:
        return self.process.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self._conn.close()
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)


class ReplicaPool:
    """``replicas`` processes serving one version; :meth:`run` is a drop-in for ``Servable.run``.

    Example:
        >>> pool = ReplicaPool("digits", 1, "models/digits/1", replicas=2)   # doctest: +SKIP
        >>> pool.run("serving_default", {"image": x})["logits"]               # doctest: +SKIP
        >>> pool.close()                                                       # doctest: +SKIP
    """

    def __init__(self, name: str, version: int, path: str | os.PathLike[str], *, replicas: int = 2,
                 intra_op_threads: int = 0, max_retries: int = 2, call_timeout: float = 60.0,
                 log: Callable[[str], None] | None = None) -> None:
        self.name, self.version, self.path = name, version, Path(path)
        self.size = positive_int("replicas", replicas)
        self.max_retries = integer("max_retries", max_retries, minimum=0)
        self.intra_op_threads = intra_op_threads
        self.call_timeout = call_timeout
        self.log = log or (lambda line: None)
        self._idle: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self.restarts = 0
        self.retries = 0
        self.calls = 0
        self.replicas: list[Replica] = []
        for index in range(self.size):
            replica = self._spawn(index)
            self.replicas.append(replica)
            self._idle.put(replica)

    def _spawn(self, index: int) -> Replica:
        return Replica(index, self.name, self.version, self.path, intra_op_threads=self.intra_op_threads)

    def run(self, signature: str | None, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One call on an idle replica; retried on another if that replica dies meanwhile."""
        for attempt in range(self.max_retries + 1):
            try:
                replica = self._idle.get(timeout=self.call_timeout)
            except queue.Empty:
                raise ServingError(f"No replica of {self.name!r} became free within {self.call_timeout:g}s.",
                                   Code.UNAVAILABLE) from None
            try:
                outputs = replica.call(signature, arrays)
            except ReplicaDied as exc:
                self.log(f"{exc}; restarting it" + ("" if attempt == self.max_retries else ", retrying the call"))
                self._replace(replica)
                with self._lock:
                    self.retries += attempt < self.max_retries
                continue
            except _RemoteError:
                self._idle.put(replica)
                raise
            with self._lock:
                self.calls += 1
            self._idle.put(replica)
            return outputs
        raise ServingError(f"The call failed on {self.max_retries + 1} replicas of {self.name!r} (each died).",
                           Code.UNAVAILABLE)

    def _replace(self, dead: Replica) -> None:
        def restart() -> None:
            dead.stop(timeout=1.0)
            while not self._closed:
                try:
                    fresh = self._spawn(dead.index)
                except RuntimeError as exc:
                    self.log(f"{exc}; trying again")
                    time.sleep(1.0)
                    continue
                with self._lock:
                    self.replicas[dead.index] = fresh
                    self.restarts += 1
                self.log(f"replica {dead.index} restarted (pid {fresh.pid})")
                if self._closed:
                    fresh.stop()
                else:
                    self._idle.put(fresh)
                return

        threading.Thread(target=restart, name=f"tfl-replica-restart-{dead.index}", daemon=True).start()

    def pids(self) -> list[int]:
        with self._lock:
            return [r.pid for r in self.replicas]

    def close(self) -> None:
        """Stops every replica (calls in flight should have finished: the front drains first)."""
        self._closed = True
        with self._lock:
            replicas = list(self.replicas)
        for replica in replicas:
            replica.stop()
