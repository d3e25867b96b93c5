"""Dynamic batching: concurrent requests queued and run as one signature call.

Two policies decide when a batch goes. ``timeout`` (TF Serving's shared batch scheduler): when the
queued requests hold ``max_batch_size`` rows or the oldest has waited ``batch_timeout_micros``, so
a lone request always waits out the timeout. ``adaptive`` (the default) waits only while the load
makes a fuller batch likely, never when the server is idle: a batch goes at once when requests
arrive too far apart for a companion to come within the timeout, or when the queue holds as many
rows as were in flight (queued or running) at the most during the last few batches, i.e. when the
callers of a steady load are all in. Short of that it waits for the rest, until arrivals pause
(no request for two mean gaps between arrivals), the batch is full or its oldest request has
waited ``batch_timeout_micros``; while another batch runs it waits behind it. At concurrency 1 a
request is all the load there is, so it goes at once. The rows are stacked and padded with zeros
to the next of a few allowed batch sizes, so the signature only ever sees those shapes and its
kernels are chosen once per size; every caller gets back exactly its own rows.

The smallest allowed size is 2: on CPU a one-row matmul takes another kernel path than a
many-row one (results differ in the last bit), so padding a lone row to 2 makes every row's
result independent of how it was batched. The adaptive policy runs a lone one-row request
unpadded, as a per-request call would (the padded row cost a third more on the digits CNN); its
answer then equals the per-request one, and a batched row's differs from it by float32 rounding. The math (sizes,
padding, stacking, splitting) is in small pure functions that tests check with numpy alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Mapping, Sequence, Union

import numpy as np

from tensorfleet.serving.errors import Code, ServingError
from tensorfleet.validation import choice, integer, positive_int

__all__ = ["BatchingPolicy", "Batcher", "BatchingOptions", "allowed_batch_sizes", "merge_rows", "padded_size",
           "split_rows"]

Arrays = Mapping[str, np.ndarray]
_LOG = logging.getLogger(__name__)


def allowed_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two from 2 up to ``max_batch_size``, and ``max_batch_size`` itself.

    Example:
        >>> allowed_batch_sizes(32), allowed_batch_sizes(12), allowed_batch_sizes(1)
        ((2, 4, 8, 16, 32), (2, 4, 8, 12), (1,))
    """
    positive_int("max_batch_size", max_batch_size)
    sizes = {max_batch_size}
    size = 2
    while size < max_batch_size:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes))


def padded_size(rows: int, allowed: Sequence[int]) -> int:
    """The smallest allowed size that holds ``rows``; ``rows`` itself when none does (run unpadded).

    Example:
        >>> padded_size(1, (2, 4, 8)), padded_size(5, (2, 4, 8)), padded_size(9, (2, 4, 8))
        (2, 8, 9)
    """
    return next((size for size in sorted(allowed) if size >= rows), rows)


def merge_rows(requests: Sequence[Arrays], size: int) -> dict[str, np.ndarray]:
    """Each input of ``requests`` stacked along the batch axis, then zero-padded to ``size`` rows.

    Example:
        >>> merge_rows([{"x": np.ones((1, 2))}, {"x": np.full((2, 2), 2.0)}], 4)["x"].tolist()
        [[1.0, 1.0], [2.0, 2.0], [2.0, 2.0], [0.0, 0.0]]
    """
    merged = {}
    for name in requests[0]:
        stacked = np.concatenate([r[name] for r in requests]) if len(requests) > 1 else requests[0][name]
        if size > stacked.shape[0]:
            pad = np.zeros((size - stacked.shape[0], *stacked.shape[1:]), stacked.dtype)
            stacked = np.concatenate([stacked, pad])
        merged[name] = stacked
    return merged


def split_rows(outputs: Arrays, counts: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """The batch's outputs cut back into one dict per request (``counts`` rows each, padding dropped).

    Example:
        >>> [r["y"].tolist() for r in split_rows({"y": np.arange(4)}, [1, 2])]
        [[0], [1, 2]]
    """
    starts = np.concatenate([[0], np.cumsum(counts)])
    return [{k: v[starts[i]:starts[i + 1]] for k, v in outputs.items()} for i in range(len(counts))]


class BatchingPolicy(str, Enum):
    """When a batch goes: ``adaptive`` (at once when the load's requests are in) or ``timeout`` (TF Serving's)."""

    ADAPTIVE = "adaptive"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class BatchingOptions:
    """TF Serving's batching parameters.

    Args:
        max_batch_size: the most rows one signature call takes.
        batch_timeout_micros: how long the first request of a batch waits for others at most.
        num_batch_threads: batches that may run at once.
        allowed_batch_sizes: sizes batches are padded to (default: :func:`allowed_batch_sizes`).
        max_enqueued_batches: queued requests beyond this many batches' worth are refused
            (RESOURCE_EXHAUSTED / HTTP 429) instead of waiting without bound.
        policy: ``adaptive`` (a batch waits only while more of the load's requests are on their way)
            or ``timeout`` (the first request of a batch always waits ``batch_timeout_micros`` for
            others, as TF Serving does).
    """

    max_batch_size: int = 32
    batch_timeout_micros: int = 1000
    num_batch_threads: int = 2
    allowed_batch_sizes: tuple[int, ...] | None = None
    max_enqueued_batches: int = 100
    policy: BatchingPolicy = BatchingPolicy.ADAPTIVE

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", choice(BatchingPolicy, "policy", self.policy))
        positive_int("max_batch_size", self.max_batch_size)
        integer("batch_timeout_micros", self.batch_timeout_micros, minimum=0)
        positive_int("num_batch_threads", self.num_batch_threads)
        positive_int("max_enqueued_batches", self.max_enqueued_batches)
        if self.allowed_batch_sizes is not None:
            sizes = tuple(positive_int("allowed_batch_sizes", s) for s in self.allowed_batch_sizes)
            if not sizes or max(sizes) != self.max_batch_size:
                raise ValueError("allowed_batch_sizes must end with max_batch_size "
                                 f"({self.max_batch_size}). Received: allowed_batch_sizes={list(sizes)}")
            object.__setattr__(self, "allowed_batch_sizes", tuple(sorted(sizes)))

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.allowed_batch_sizes or allowed_batch_sizes(self.max_batch_size)


Done = Callable[[Union[dict, BaseException]], None]  # told a request's outputs, or its failure


class _Task:
    """A queued request: its arrays, and the future of its outputs or the callable told them."""

    __slots__ = ("arrays", "rows", "future", "done", "since")

    def __init__(self, arrays: Arrays, done: Done | None) -> None:
        self.arrays = arrays
        self.rows = next(iter(arrays.values())).shape[0]
        self.done = done
        self.future: Future | None = Future() if done is None else None
        self.since = time.monotonic()

    def live(self) -> bool:
        """False if its caller cancelled the future before the batch started."""
        return self.future is None or self.future.set_running_or_notify_cancel()

    def answer(self, outcome: dict | BaseException) -> None:
        future = self.future
        if future is None:
            assert self.done is not None  # a task has a future or a callable to tell (__init__)
            try:
                self.done(outcome)
            except Exception:  # the caller's callable failed: the batch thread lives on, as a future's would
                _LOG.exception("the callable told a batched request's outcome raised")
        elif isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


QUIET_GAPS = 2.0  # adaptive: arrivals have paused after this many mean gaps without a request (beyond
# the time the front needs to send out the answers of the last batch, one mean gap per answer)
PEAK_BATCHES = 8  # adaptive: the load's size is the most rows in flight over this many batches


class Batcher:
    """Queues requests for one signature and runs them in batches on ``num_batch_threads`` threads.

    A batch is due when the queued rows reach ``max_batch_size`` or its oldest request has waited
    ``batch_timeout_micros``; with the adaptive policy also when requests arrive further apart (a
    moving mean of the gaps) than the timeout, when the queue holds the rows the load had in flight
    at its peak over the last batches, or when arrivals pause. A request wakes a batch thread only
    when it is the first in the queue, completes what a thread waits for or fills a batch, not every
    time: the threads do not trade the interpreter lock per request.

    Example:
        >>> batcher = Batcher(lambda a: {"y": a["x"] * 2}, BatchingOptions(max_batch_size=4))
        >>> batcher.submit({"x": np.array([1.0, 2.0])}).result()["y"].tolist()
        [2.0, 4.0]
        >>> batcher.close()
    """

    def __init__(self, run: Callable[[Arrays], Mapping[str, np.ndarray]], options: BatchingOptions,
                 *, name: str = "batcher") -> None:
        self._run = run
        self.options = options
        self._tasks: deque[_Task] = deque()
        self._rows = 0
        self._limit = options.max_enqueued_batches * options.max_batch_size
        self._closed = False
        self._lock = threading.Lock()
        self._due = threading.Condition(self._lock)
        self._adaptive = options.policy is BatchingPolicy.ADAPTIVE
        self._running = 0  # batches taken and not yet answered
        self._last_arrival = time.monotonic()
        self._gap = float("inf")  # moving mean of the seconds between arrivals
        self._in_flight = 0  # rows queued or in a running batch
        self._peak = 0  # the most rows in flight since the last batch was taken
        self._peaks: deque[int] = deque([1], maxlen=PEAK_BATCHES)  # that most, for the last batches
        self._handed_back, self._answers = time.monotonic(), 0  # when the last batch's answers went, how many
        self._want = options.max_batch_size + 1  # the queued rows a waiting thread is woken at
        self.batches = 0
        self._threads = [threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
                         for i in range(options.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, arrays: Arrays, done: Done | None = None) -> Future | None:
        """Queues one request's checked arrays; the future holds exactly its rows of every output.

        With ``done``, no future is made: ``done(outputs)`` (or ``done(exception)``) is called on the
        batch thread, which costs less per request than a future and its callbacks.
        """
        task = _Task(arrays, done)
        with self._lock:
            if self._closed:
                raise ServingError("The server is shutting down.", Code.UNAVAILABLE)
            if len(self._tasks) >= self._limit:
                raise ServingError(f"The batch queue is full ({self._limit} requests waiting); retry later.",
                                   Code.RESOURCE_EXHAUSTED)
            self._tasks.append(task)
            gap, self._last_arrival = task.since - self._last_arrival, task.since
            self._gap = gap if self._gap == float("inf") else 0.8 * self._gap + 0.2 * gap
            self._in_flight += task.rows
            self._peak = max(self._peak, self._in_flight)
            before, self._rows = self._rows, self._rows + task.rows
            if before == 0:
                self._due.notify()  # an idle thread starts gathering this batch
            elif before < self.options.max_batch_size <= self._rows:
                self._due.notify_all()  # the batch is full: whoever gathers it runs it now
            elif before < self._want <= self._rows:
                self._due.notify()  # the rows a thread waits for are in
        return task.future

    @property
    def queue_depth(self) -> int:
        """Requests waiting to join a batch."""
        return len(self._tasks)

    @property
    def load(self) -> int:
        """Adaptive: the rows a batch waits for, the most in flight over the last batches (at least 1)."""
        with self._lock:
            return min(max(self._peaks), self.options.max_batch_size)

    def close(self, timeout: float | None = 30.0) -> None:
        """Stops taking requests, runs every queued one, then stops the threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._due.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def _wait(self) -> float:
        """Seconds the queued batch may still wait (<= 0: it is due now). Called with the lock held."""
        largest, timeout = self.options.max_batch_size, self.options.batch_timeout_micros / 1e6
        if self._rows >= largest or self._closed:
            return 0.0
        now = time.monotonic()
        remaining = self._tasks[0].since + timeout - now
        if not self._adaptive or self._running:
            return remaining  # the timeout rule, or waiting behind a running batch (woken when it ends)
        if self._gap > timeout:
            return 0.0  # requests come too far apart for a companion to come within the timeout
        self._want = min(max(self._peaks), largest)
        if self._rows >= self._want:
            return 0.0  # the load's requests are all in (at concurrency 1: this one)
        # until arrivals pause; the front sending out the last batch's answers is not a pause in the load
        quiet = max(self._last_arrival + QUIET_GAPS * self._gap,
                    self._handed_back + (self._answers + QUIET_GAPS) * self._gap)
        return min(remaining, quiet - now)

    def _take(self) -> list[_Task] | None:
        """Blocks until a batch is due and takes it (None once closed with nothing queued)."""
        with self._lock:
            while True:
                if not self._tasks:
                    if self._closed:
                        return None
                    self._due.wait()
                    continue
                remaining = self._wait()
                if remaining <= 0:
                    break
                self._due.wait(remaining)
            self._want = self.options.max_batch_size + 1
            self._peaks.append(self._peak)
            self._peak = self._in_flight
            batch: list[_Task] = []
            rows = 0
            while self._tasks and (not batch or rows + self._tasks[0].rows <= self.options.max_batch_size):
                task = self._tasks.popleft()
                batch.append(task)
                rows += task.rows
            self._rows -= rows
            self._running += 1
            if self._tasks:
                self._due.notify()  # another thread may gather the next batch meanwhile
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            live = [t for t in batch if t.live()]
            outputs: Mapping[str, np.ndarray] | Exception | None = None
            try:
                outputs = self._execute(live)
            except Exception as exc:  # every caller of the batch gets the failure, the thread lives on
                outputs = exc
            finally:
                with self._lock:  # counted out before any caller hears back (and sends its next request)
                    self._running -= 1
                    self._handed_back, self._answers = time.monotonic(), len(live)
                    self._in_flight -= sum(t.rows for t in batch)
                    self.batches += isinstance(outputs, Mapping)
                    if self._tasks:
                        self._due.notify()  # a thread waiting behind this batch takes what queued meanwhile
            if isinstance(outputs, Exception):
                for task in live:
                    task.answer(outputs)
            elif outputs is not None and len(live) == 1 and len(next(iter(outputs.values()))) == live[0].rows:
                live[0].answer(dict(outputs))  # a lone request run unpadded: every row is its own
            elif outputs is not None:
                for task, rows in zip(live, split_rows(outputs, [t.rows for t in live])):
                    task.answer(rows)

    def _execute(self, batch: list[_Task]) -> Mapping[str, np.ndarray] | None:
        """The batch's outputs, one signature call on its merged (and padded) rows; None if empty."""
        if not batch:
            return None
        counts = [t.rows for t in batch]
        # adaptive: a lone one-row request runs as it came, as a per-request call does (a padded
        # second row costs a third more on CPU); anything batched is padded to an allowed size
        size = 1 if self._adaptive and counts == [1] else padded_size(sum(counts), self.options.sizes)
        return self._run(merge_rows([t.arrays for t in batch], size))
