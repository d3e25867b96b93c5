"""A model's base directory and the versions loaded from it, found by name, version or label.

The layout is TF Serving's: ``BASE/<integer version>/saved_model.pb``; other entries are ignored.
The version policy is TF Serving's too: ``latest`` serves the highest version, ``all`` every one.
"""

from __future__ import annotations

import os
import threading
from enum import Enum
from pathlib import Path
from typing import Mapping, Sequence

from tensorfleet.io import existing_folder
from tensorfleet.serving.errors import Code, ServingError
from tensorfleet.serving.servable import Servable
from tensorfleet.serving.warmup import replay
from tensorfleet.validation import choice, positive_int

__all__ = ["ModelRepository", "VersionPolicy", "versions_on_disk"]


class VersionPolicy(str, Enum):
    """Which versions under the base directory are served (TF Serving's model_version_policy):
    the ``latest`` (highest; ``num_versions`` of them), ``all``, or ``specific`` ones."""

    LATEST = "latest"
    ALL = "all"
    SPECIFIC = "specific"


def versions_on_disk(base: str | os.PathLike[str]) -> list[int]:
    """The complete versions under ``base`` (integer directories holding a saved_model.pb), ascending."""
    base = Path(base)
    if not base.is_dir():
        return []
    return sorted(int(p.name) for p in base.iterdir()
                  if p.name.isdigit() and (p / "saved_model.pb").is_file())


class ModelRepository:
    """One served model: its name, base directory and loaded versions.

    Example:
        >>> repo = ModelRepository("digits", "models/digits")  # doctest: +SKIP
        >>> repo.get("digits").version                           # doctest: +SKIP
        1
    """

    def __init__(self, name: str, base_path: str | os.PathLike[str], *, policy: str | VersionPolicy = "latest",
                 labels: Mapping[str, int] | None = None, num_versions: int = 1,
                 specific: Sequence[int] = ()) -> None:
        if not name or "/" in name or ":" in name:
            raise ValueError(f"model_name must be a non-empty name without '/' or ':'. Received: model_name={name!r}")
        self.name = name
        self.base = Path(base_path)
        self.policy = choice(VersionPolicy, "model_version_policy", policy)
        self.num_versions = positive_int("num_versions", num_versions)
        self.specific = tuple(positive_int("specific versions", v) for v in specific)
        if (self.policy is VersionPolicy.SPECIFIC) != bool(self.specific):
            raise ValueError(f"The specific version policy takes the versions to serve (and only it does). Received: "
                             f"model_version_policy={self.policy.value!r}, versions={list(self.specific)}")
        self.labels = dict(labels or {})
        self._lock = threading.Lock()
        self.servables: dict[int, Servable] = {}

    def load(self) -> list[int]:
        """Loads the versions the policy selects; returns them. Fails clearly when there is none."""
        existing_folder(self.base, "a model base directory (BASE/<version>/saved_model.pb)")
        found = versions_on_disk(self.base)
        if not found:
            raise FileNotFoundError(f"No version under {str(self.base)!r}: expected {self.base}/<integer>/"
                                    "saved_model.pb (write one with `tensorfleet serving export`).")
        if not self.wanted(found):
            raise FileNotFoundError(f"None of the versions {list(self.specific)} of {self.name!r} is under "
                                    f"{str(self.base)!r}; found {found}.")
        loaded = {v: Servable(self.name, v, self.base / str(v)) for v in self.wanted(found)}
        for servable in loaded.values():  # before any request: what TF Serving does on load
            replay(servable)
        unknown = {k: v for k, v in self.labels.items() if v not in loaded}
        if unknown:
            raise ValueError(f"Labels point at versions that are not served: {unknown}; served: {sorted(loaded)}.")
        with self._lock:
            self.servables = loaded
        return sorted(loaded)

    def wanted(self, found: list[int]) -> list[int]:
        """The versions of ``found`` (ascending) that the policy serves."""
        if self.policy is VersionPolicy.LATEST:
            return found[-self.num_versions:]
        if self.policy is VersionPolicy.SPECIFIC:
            return [v for v in found if v in self.specific]
        return list(found)

    def add(self, servable: Servable) -> None:
        """Starts serving a loaded version (it becomes the latest if it is the highest)."""
        with self._lock:
            self.servables[servable.version] = servable

    def remove(self, version: int) -> Servable | None:
        """Stops routing requests to ``version``; requests already given it finish on it."""
        with self._lock:
            return self.servables.pop(version, None)

    @property
    def versions(self) -> list[int]:
        with self._lock:
            return sorted(self.servables)

    def get(self, name: str, version: int | None = None, label: str | None = None) -> Servable:
        """The servable for a request: the latest version unless a version or a label pins one."""
        if name != self.name:
            raise ServingError(f"Servable not found for request: model {name!r} is not served (this server "
                               f"serves {self.name!r}).", Code.NOT_FOUND)
        if label:
            if label not in self.labels:
                raise ServingError(f"Unrecognized servable version label: {label!r}; labels: "
                                   f"{sorted(self.labels)}.", Code.NOT_FOUND)
            version = self.labels[label]
        with self._lock:
            if version is None:
                if not self.servables:
                    raise ServingError(f"No version of {name!r} is loaded.", Code.UNAVAILABLE)
                return self.servables[max(self.servables)]
            if version not in self.servables:
                raise ServingError(f"Servable not found for request: Specific({name}, {version}); served "
                                   f"versions: {sorted(self.servables)}.", Code.NOT_FOUND)
            return self.servables[version]

    def status(self, name: str, version: int | None = None) -> list[tuple[int, str]]:
        """(version, state) pairs as TF Serving reports them: AVAILABLE for every loaded version."""
        if name != self.name:
            raise ServingError(f"Could not find any versions of model {name!r}.", Code.NOT_FOUND)
        versions = self.versions if version is None else [self.get(name, version).version]
        return [(v, "AVAILABLE") for v in versions]
