"""Version changes while serving: the base directory is polled, as TF Serving's file-system source does.

A new version is loaded, warmed up (its ``assets.extra/tf_serving_warmup_requests`` replayed,
else one call of every signature on zeros) and made ready (its
replicas started) before requests are routed to it; the switch is one assignment under the
repository's lock, so every request goes wholly to the old version or wholly to the new. The old
version, no longer routed to, finishes its requests in flight and is then unloaded. A version
that fails to load or warm up is refused, logged once, and the current one keeps serving.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from tensorfleet.serving.predictor import Predictor
from tensorfleet.serving.repository import versions_on_disk
from tensorfleet.serving.servable import Servable
from tensorfleet.serving.warmup import replay

__all__ = ["VersionWatcher", "warm_up"]


def warm_up(servable: Servable) -> None:
    """Runs every signature once on two rows of zeros, so a broken version fails here, not on a request."""
    for name, signature in servable.signatures.items():
        if any(d is None for spec in signature.inputs.values() for d in spec.shape[1:]):
            continue  # a shape only a real request can fill in
        servable.run(name, {k: np.zeros((2, *spec.shape[1:]), spec.dtype) for k, spec in signature.inputs.items()})


class VersionWatcher:
    """Polls a :class:`~tensorfleet.serving.predictor.Predictor`'s base directory every ``seconds``.

    Example:
        >>> watcher = VersionWatcher(predictor, seconds=1.0, log=print).start()  # doctest: +SKIP
        >>> watcher.stop()                                                        # doctest: +SKIP
    """

    def __init__(self, predictor: Predictor, *, seconds: float = 1.0, drain_seconds: float = 30.0,
                 log: Callable[[str], None] | None = None) -> None:
        self.predictor = predictor
        self.repository = predictor.repository
        self.seconds, self.drain_seconds = seconds, drain_seconds
        self.log = log or (lambda line: None)
        self.refused: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tfl-serving-versions", daemon=True)

    def start(self) -> VersionWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.drain_seconds + 30)

    def _loop(self) -> None:
        while not self._stop.wait(self.seconds):
            try:
                self.poll()
            except Exception as exc:  # a bad poll must not end polling
                self.log(f"version poll failed: {type(exc).__name__}: {exc}")

    def poll(self) -> tuple[list[int], list[int]]:
        """One look at the base directory: (versions loaded, versions unloaded)."""
        repo = self.repository
        found = [v for v in versions_on_disk(repo.base) if v not in self.refused]
        added = [v for v in repo.wanted(found) if v not in repo.versions and self._load(v)]
        alive = sorted(set(repo.versions) & set(found)) or repo.versions  # never unload the last one serving
        keep = set(repo.wanted(alive))
        removed = [v for v in repo.versions if v not in keep]
        for version in removed:
            repo.remove(version)
            drained = self.predictor.retire(version, self.drain_seconds)
            self.log(f"version {version} unloaded" + ("" if drained else " (requests still running after "
                                                                         f"{self.drain_seconds:g}s)"))
        return added, removed

    def _load(self, version: int) -> bool:
        repo = self.repository
        try:
            servable = Servable(repo.name, version, repo.base / str(version))
            if not replay(servable):
                warm_up(servable)
            self.predictor.prepare(servable, self.log)
        except Exception as exc:  # a broken version is refused; the current one keeps serving
            self.refused[version] = f"{type(exc).__name__}: {exc}"
            self.log(f"version {version} refused: {self.refused[version]}")
            return False
        repo.add(servable)
        self.log(f"version {version} loaded, warmed up and serving")
        return True
