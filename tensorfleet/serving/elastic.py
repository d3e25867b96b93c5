"""Elastic serving: replicas added while requests queue too long for one, removed when idle.

Every ``interval`` seconds the autoscaler looks at how long calls waited for a free replica over
the last interval (:meth:`ReplicaPool.waits_since`). A mean wait over ``target_wait`` for
``up_after`` looks in a row adds a replica (up to ``max_replicas``); no call at all for
``down_after`` looks in a row removes one (down to ``min_replicas``, and never below one that
way). With ``min_replicas=0`` the pool scales to zero: once no call has come for ``idle_timeout``
seconds, the last replicas are stopped, each when it holds no call; the next call starts one (a
cold start, :meth:`ReplicaPool.run`). Each scale event is logged, kept in
:attr:`Autoscaler.events` and drawn, with the cold starts, by :meth:`Autoscaler.plot`.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tensorfleet.serving.replicas import ReplicaPool
from tensorfleet.validation import integer, number

__all__ = ["Autoscaler", "ScaleEvent", "decide"]


@dataclass(frozen=True)
class ScaleEvent:
    """One change in the number of replicas: when (seconds since the autoscaler started) and why."""

    seconds: float
    before: int
    after: int
    reason: str


def decide(waits: list[float], size: int, *, minimum: int, maximum: int, target_wait: float,
           hot: int, idle: int, up_after: int, down_after: int) -> tuple[int, int, int]:
    """(change in replicas: -1, 0 or +1, new hot streak, new idle streak) from one interval's waits.

    Example:
        >>> decide([0.02, 0.03], 1, minimum=1, maximum=3, target_wait=0.01, hot=1, idle=0, up_after=2, down_after=3)
        (1, 0, 0)
        >>> decide([], 2, minimum=1, maximum=3, target_wait=0.01, hot=0, idle=2, up_after=2, down_after=3)
        (-1, 0, 0)
        >>> decide([0.001], 2, minimum=1, maximum=3, target_wait=0.01, hot=1, idle=2, up_after=2, down_after=3)
        (0, 0, 0)
    """
    hot = hot + 1 if waits and statistics.fmean(waits) > target_wait else 0
    idle = idle + 1 if not waits else 0
    if hot >= up_after and size < maximum:
        return 1, 0, 0
    if idle >= down_after and size > minimum:
        return -1, 0, 0
    return 0, hot, idle


class Autoscaler:
    """Keeps a :class:`ReplicaPool` between ``min_replicas`` and ``max_replicas`` by its queue latency.

    Example:
        >>> scaler = Autoscaler(pool, min_replicas=1, max_replicas=4, target_wait=0.01).start()  # doctest: +SKIP
        >>> scaler.stop(); scaler.plot("scale.png")                                            # doctest: +SKIP
    """

    def __init__(self, pool: ReplicaPool, *, min_replicas: int, max_replicas: int, target_wait: float = 0.01,
                 interval: float = 1.0, up_after: int = 2, down_after: int = 5, idle_timeout: float = 60.0,
                 log: Callable[[str], None] | None = None) -> None:
        self.pool = pool
        self.min_replicas = integer("min_replicas", min_replicas, minimum=0)
        self.max_replicas = integer("max_replicas", max_replicas, minimum=max(self.min_replicas, 1))
        self.idle_timeout = number("idle_timeout", idle_timeout, above=0)
        self.target_wait = number("target_wait", target_wait, above=0)
        self.interval = number("interval", interval, above=0)
        self.up_after = integer("up_after", up_after, minimum=1)
        self.down_after = integer("down_after", down_after, minimum=1)
        self.log = log or (lambda line: None)
        self.events: list[ScaleEvent] = []
        self.sizes: list[tuple[float, int]] = []
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._growing = threading.Event()  # a replica being added
        self._thread = threading.Thread(target=self._loop, name="tfl-serving-autoscaler", daemon=True)

    def start(self) -> Autoscaler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(120)

    def _loop(self) -> None:
        hot = idle = 0
        last = time.monotonic()
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            waits, last = self.pool.waits_since(last), now
            size = self.pool.size
            self.sizes.append((now - self._start, size))
            if size == 0 or self._growing.is_set():  # a call finding no replica starts one itself (a cold start)
                continue
            try:
                if self.min_replicas == 0 and self.pool.idle_seconds() >= self.idle_timeout:
                    self._to_zero(size)
                    continue
                change, hot, idle = decide(waits, size, minimum=max(self.min_replicas, 1),
                                           maximum=self.max_replicas, target_wait=self.target_wait, hot=hot,
                                           idle=idle, up_after=self.up_after, down_after=self.down_after)
                if change:
                    self._scale(change, size, waits)
            except Exception as exc:  # a replica that cannot start must not end autoscaling
                self._failed(size, exc)

    def _failed(self, size: int, exc: Exception) -> None:
        self.log(f"scaling {self.pool.name!r} from {size} replicas failed: {type(exc).__name__}: {exc}")

    def _record(self, before: int, after: int, reason: str) -> None:
        event = ScaleEvent(time.monotonic() - self._start, before, after, reason)
        self.events.append(event)
        self.sizes.append((event.seconds, after))
        self.log(f"scaled {self.pool.name!r} v{self.pool.version} from {before} to {after} replicas: {reason}")

    def _to_zero(self, size: int) -> None:
        """Stops the replicas one by one, each once it holds no call; a call arriving meanwhile stops it."""
        after = size
        while after and self.pool.idle_seconds() >= self.idle_timeout:
            after = self.pool.shrink(timeout=1.0, minimum=0)
        if after < size:
            self._record(size, after, f"no request for {self.idle_timeout:g} s (idle timeout)")

    def _scale(self, change: int, size: int, waits: list[float]) -> None:
        if change > 0:  # in the background: the loop goes on looking (and may scale to zero) while it loads
            if self._growing.is_set():
                return
            self._growing.set()
            reason = (f"mean wait for a replica {statistics.fmean(waits) * 1e3:.1f} ms > target "
                      f"{self.target_wait * 1e3:g} ms for {self.up_after} intervals")

            def grow() -> None:
                try:
                    self._record(size, self.pool.grow(), reason)
                except Exception as exc:  # a replica that cannot start must not end autoscaling
                    self._failed(size, exc)
                finally:
                    self._growing.clear()

            threading.Thread(target=grow, name="tfl-serving-grow", daemon=True).start()
        else:
            self._record(size, self.pool.shrink(), f"no request for {self.down_after} intervals")

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """A PNG of the replica count over time with each scale event marked."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        from tensorfleet.io import save_figure

        fig, ax = plt.subplots(figsize=(7, 3))
        colds = [(began - self._start, seconds) for began, seconds in self.pool.cold_starts if began >= self._start]
        # The count is sampled each interval; a cold start (from zero, to one replica) is placed when it ended.
        points = sorted([*self.sizes, *((t + d, 1) for t, d in colds)])
        if points:
            times, counts = zip(*points)
            ax.step(times, counts, where="post", label="replicas")
        for event in self.events:
            ax.axvline(event.seconds, color="tab:green" if event.after > event.before else "tab:red", alpha=0.5)
        if colds:
            ax.scatter([t + d for t, d in colds], [1] * len(colds), marker="^", color="tab:purple", zorder=3,
                       label=f"cold starts ({len(colds)}, longest {max(d for _, d in colds):.2f} s)")
            ax.legend(loc="upper right", fontsize="small")
        ax.set_xlabel("seconds")
        ax.set_ylabel("replicas")
        ax.set_ylim(0, self.max_replicas + 1)
        ax.set_title(f"{self.pool.name} v{self.pool.version}: {len(self.events)} scale events, "
                     f"{len(colds)} cold starts")
        return save_figure(fig, path)
