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

import os
import queue
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from tensorfleet.serving.errors import Code, ServingError
from tensorfleet.serving.standby import READY, Standby, StandbySupply
from tensorfleet.validation import integer

__all__ = ["Replica", "ReplicaPool"]



class _RemoteError(Exception):
    def __init__(self, kind: str, message: str, error_code: int | None) -> None:
        super().__init__(f"{kind} in replica: {message}")
        self.error_code = error_code
        self.message = f"{kind}: {message}"


class ReplicaDied(Exception):
    """The replica's process ended (or its pipe broke) during a call."""


class Replica:
    """One worker process holding one model version (a :class:`Standby` given is used, not a new process)."""

    def __init__(self, index: int, name: str, version: int, path: Path, *, intra_op_threads: int = 0,
                 start_timeout: float = 120.0, standby: Standby | None = None) -> None:
        self.index = index
        worker = standby or Standby(intra_op_threads=intra_op_threads)
        self._worker, self._conn, self.process = worker, worker.conn, worker.process
        self.warmup_records, self.load_seconds, self.warmup_seconds = 0, 0.0, 0.0
        where = f"Replica {index} of {name!r} v{version}"
        try:
            self.pid = worker.imported(start_timeout)
            self._conn.send((name, version, str(path)))
            if not self._conn.poll(start_timeout):
                raise RuntimeError(f"{where} did not load within {start_timeout:g}s.")
            tag, (self.warmup_records, self.load_seconds, self.warmup_seconds) = self._conn.recv()
            assert tag == READY, tag
        except (EOFError, OSError):
            self.stop()
            raise RuntimeError(f"{where} exited while loading (exit code {self.process.exitcode}).") from None
        except BaseException:
            self.stop()
            raise
        self.started = time.monotonic()

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
        self._worker.stop(timeout)


class _Waiter:
    __slots__ = ("event", "item", "since")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.item: Replica | None = None
        self.since = time.monotonic()


class _FairQueue:
    """Idle replicas handed to waiting callers in arrival order.

    ``queue.Queue`` lets the thread that just put a replica back take it again before a waiter
    wakes, so one caller can keep a replica while others starve; here a returned replica goes
    straight to the longest waiter.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: deque[Replica] = deque()
        self._waiters: deque[_Waiter] = deque()

    def put(self, item: Replica) -> None:
        with self._lock:
            if self._waiters:
                waiter = self._waiters.popleft()
                waiter.item = item
                waiter.event.set()
            else:
                self._items.append(item)

    def get(self, timeout: float, check: Callable[[], None] | None = None) -> Replica:
        """The next idle replica; while waiting, ``check`` is called every 0.2 s (the waiter keeps its place)."""
        with self._lock:
            if self._items:
                return self._items.popleft()
            waiter = _Waiter()
            self._waiters.append(waiter)
        deadline = waiter.since + timeout
        while not waiter.event.wait(max(0.0, min(0.2, deadline - time.monotonic()))):
            if time.monotonic() < deadline:
                if check is not None:
                    check()
                continue
            with self._lock:
                if not waiter.event.is_set():
                    self._waiters.remove(waiter)
                    raise queue.Empty
        assert waiter.item is not None  # put() sets it before the event
        return waiter.item

    def oldest_wait(self) -> float:
        """Seconds the longest-waiting caller has waited so far (0 when none waits)."""
        with self._lock:
            return time.monotonic() - self._waiters[0].since if self._waiters else 0.0


class ReplicaPool:
    """``replicas`` processes serving one version; :meth:`run` is a drop-in for ``Servable.run``.

    With ``standby`` (a :class:`~tensorfleet.serving.standby.StandbySupply`, which may serve several
    pools), a replica added (above all the first after the pool went to zero, a cold start) starts
    on a process that has TensorFlow imported already and only loads the version; ``replicas``
    may then be 0. A call that finds no replica at all starts one and waits for it.

    Example:
        >>> pool = ReplicaPool("digits", 1, "models/digits/1", replicas=2)   # doctest: +SKIP
        >>> pool.run("serving_default", {"image": x})["logits"]               # doctest: +SKIP
        >>> pool.close()                                                       # doctest: +SKIP
    """

    def __init__(self, name: str, version: int, path: str | os.PathLike[str], *, replicas: int = 2,
                 intra_op_threads: int = 0, max_retries: int = 2, call_timeout: float = 60.0,
                 standby: StandbySupply | None = None, log: Callable[[str], None] | None = None) -> None:
        self.name, self.version, self.path = name, version, Path(path)
        count = integer("replicas", replicas, minimum=0 if standby is not None else 1)
        self.max_retries = integer("max_retries", max_retries, minimum=0)
        self.intra_op_threads = intra_op_threads
        self.call_timeout = call_timeout
        self.log = log or (lambda line: None)
        self._idle = _FairQueue()
        self._lock = threading.Lock()
        self._closed = False
        self.restarts = 0
        self.retries = 0
        self.calls = 0
        self.waits: deque[tuple[float, float]] = deque(maxlen=10_000)  # (when, seconds waited for a replica)
        self.replicas: dict[int, Replica] = {}
        self._next_index = 0
        self.cold_starts: list[tuple[float, float]] = []  # (when it began, seconds until a replica was ready)
        self.warmup_records = 0  # warm-up records replayed, over every replica started
        self.last_started: Replica | None = None
        self.last_call = time.monotonic()
        self._in_call = 0  # calls holding a replica now
        self._stopped_seconds = 0.0  # replica-seconds of the replicas already stopped
        self._starting = False
        self._standby = standby
        for _ in range(count):
            self.grow()

    @property
    def size(self) -> int:
        with self._lock:
            return len(self.replicas)

    def grow(self) -> int:
        """Starts one more replica (blocks while it loads); returns the count."""
        with self._lock:
            index, self._next_index = self._next_index, self._next_index + 1
        replica = self._spawn(index)
        self.last_started = replica
        with self._lock:
            if self._closed:
                replica.stop()
                return len(self.replicas)
            self.replicas[index] = replica
            self.warmup_records += replica.warmup_records
            count = len(self.replicas)
        self._idle.put(replica)
        return count

    def shrink(self, timeout: float = 30.0, *, minimum: int = 1) -> int:
        """Stops one replica once it is idle, so it holds no call (never below ``minimum``); returns the count."""
        with self._lock:
            if len(self.replicas) <= minimum:
                return len(self.replicas)
        try:
            replica = self._idle.get(timeout=timeout)
        except queue.Empty:
            return self.size
        with self._lock:
            self.replicas.pop(replica.index, None)
            self._stopped_seconds += time.monotonic() - replica.started
            count = len(self.replicas)
        replica.stop()
        return count

    def _spawn(self, index: int) -> Replica:
        standby = self._standby.take() if self._standby is not None else None
        try:
            return Replica(index, self.name, self.version, self.path, intra_op_threads=self.intra_op_threads,
                           standby=standby)
        finally:
            if self._standby is not None and standby is not None:  # the next standby imports TensorFlow once
                self._standby.refill()                              # this replica is up, not meanwhile

    def _cold_start(self) -> None:
        """Starts a replica in the background when there is none and none is starting (a call waits)."""
        with self._lock:
            if self.replicas or self._starting or self._closed:
                return
            self._starting = True

        def start() -> None:
            began = time.monotonic()
            try:
                self.grow()
                with self._lock:
                    self.cold_starts.append((began, time.monotonic() - began))
                replica = self.last_started
                assert replica is not None  # grow() set it
                self.log(f"cold start of {self.name!r} v{self.version}: a replica ready in "
                         f"{time.monotonic() - began:.2f}s (SavedModel load {replica.load_seconds:.2f}s, "
                         f"{replica.warmup_records} warm-up records {replica.warmup_seconds:.2f}s)")
            except Exception as exc:  # the waiting call times out with UNAVAILABLE; the next one tries again
                self.log(f"cold start of {self.name!r} v{self.version} failed: {type(exc).__name__}: {exc}")
            finally:
                with self._lock:
                    self._starting = False

        threading.Thread(target=start, name=f"tfl-cold-start-{self.name}", daemon=True).start()

    def replica_seconds(self) -> float:
        """Seconds summed over every replica's life so far (the cost of serving)."""
        now = time.monotonic()
        with self._lock:
            return self._stopped_seconds + sum(now - r.started for r in self.replicas.values())

    def idle_seconds(self) -> float:
        """Seconds since the last call ended (0 while one runs or waits for a replica)."""
        return 0.0 if self._in_call or self._idle.oldest_wait() else time.monotonic() - self.last_call

    def run(self, signature: str | None, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One call on an idle replica (one is started if there is none); retried on another if that
        replica dies meanwhile."""
        for attempt in range(self.max_retries + 1):
            start = self.last_call = time.monotonic()
            self._cold_start()
            try:
                replica = self._idle.get(timeout=self.call_timeout, check=self._cold_start)
                with self._lock:
                    self.waits.append((start, time.monotonic() - start))
                    self._in_call += 1
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
                    self._in_call -= 1
                continue
            except BaseException:
                self._release(replica)
                raise
            self._release(replica, answered=True)
            return outputs
        raise ServingError(f"The call failed on {self.max_retries + 1} replicas of {self.name!r} (each died).",
                           Code.UNAVAILABLE)

    def _release(self, replica: Replica, answered: bool = False) -> None:
        """A call is over: the replica goes back to the idle queue (to the longest waiter)."""
        with self._lock:
            self.calls += answered
            self._in_call -= 1
            self.last_call = time.monotonic()
        self._idle.put(replica)

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
                    self._stopped_seconds += time.monotonic() - dead.started
                    if dead.index in self.replicas:
                        self.replicas[dead.index] = fresh
                    self.restarts += 1
                self.log(f"replica {dead.index} restarted (pid {fresh.pid})")
                if self._closed:
                    fresh.stop()
                else:
                    self._idle.put(fresh)
                return

        threading.Thread(target=restart, name=f"tfl-replica-restart-{dead.index}", daemon=True).start()

    def waits_since(self, since: float) -> list[float]:
        """Seconds each call since ``since`` (``time.monotonic()``) waited for a free replica, the
        call still waiting longest counted with its wait so far."""
        oldest = self._idle.oldest_wait()
        with self._lock:
            return [wait for start, wait in self.waits if start >= since] + ([oldest] if oldest else [])

    def pids(self) -> list[int]:
        """The replicas' process ids, oldest index first."""
        with self._lock:
            return [self.replicas[i].pid for i in sorted(self.replicas)]

    def close(self) -> None:
        """Stops every replica (calls in flight should have finished: the front drains first)."""
        with self._lock:
            self._closed = True
            replicas = list(self.replicas.values())
        for replica in replicas:
            replica.stop()
