"""The groups of :class:`~tensorfleet.serving.server.ModelServer`'s options, each a small frozen dataclass.

The common call stays short (``ModelServer("models/digits", port=8500)``); what belongs together
is passed together: ``versions=VersionOptions(policy="all", labels={"stable": 1})``,
``scaling=ScalingOptions(min_replicas=0, max_replicas=2, idle_timeout=60)``,
``stages=StageOptions(stages=2)``, ``front=FrontOptions(max_request_bytes=1 << 20)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from tensorfleet.serving.repository import VersionPolicy
from tensorfleet.validation import choice, integer, number, positive_int

__all__ = ["FrontOptions", "ScalingOptions", "StageOptions", "VersionOptions"]


@dataclass(frozen=True)
class VersionOptions:
    """Which versions are served: ``policy`` ``latest`` (the highest), ``all`` or ``specific``
    (``versions``), and labels (``{"stable": 1}``) for ``/labels/{label}`` and ``version_label``."""

    policy: VersionPolicy = VersionPolicy.LATEST
    labels: Mapping[str, int] = field(default_factory=dict)
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", choice(VersionPolicy, "model_version_policy", self.policy))
        object.__setattr__(self, "labels", dict(self.labels or {}))
        positive_int("num_versions", self.num_versions)


@dataclass(frozen=True)
class ScalingOptions:
    """The model in worker processes, and how many follow the load.

    Args:
        replicas: a fixed number of replica processes (0: the model runs in the server's process).
        min_replicas, max_replicas: elastic serving between these (both given, or neither); a
            replica is added while calls wait longer than ``target_ms`` for one, removed when idle.
            ``min_replicas=0`` scales to zero: the last replica stops after ``idle_timeout`` seconds
            without a request, a process with TensorFlow imported stands by, and the next request
            starts a replica on it (a cold start) and is answered.
        plot: a PNG of the replica count, scale events and cold starts, written on stop.
    """

    replicas: int = 0
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ms: float = 10.0
    idle_timeout: float = 60.0
    plot: str | None = None

    def __post_init__(self) -> None:
        integer("replicas", self.replicas, minimum=0)
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("min_replicas and max_replicas go together (elastic serving). Received: "
                             f"min_replicas={self.min_replicas}, max_replicas={self.max_replicas}")
        if self.min_replicas is not None:
            integer("min_replicas", self.min_replicas, minimum=0)
            integer("max_replicas", self.max_replicas, minimum=max(self.min_replicas, 1))
        number("target_ms", self.target_ms, above=0)
        number("idle_timeout", self.idle_timeout, above=0)

    @property
    def elastic(self) -> bool:
        return self.min_replicas is not None

    @property
    def bounds(self) -> tuple[int, int]:
        """The fewest and most replicas: ``(min_replicas, max_replicas)`` when elastic, else ``replicas`` twice."""
        if self.min_replicas is None or self.max_replicas is None:
            return self.replicas, self.replicas
        return self.min_replicas, self.max_replicas


@dataclass(frozen=True)
class StageOptions:
    """Model-parallel serving: above 1 ``stages``, requests run stage to stage through the version's
    ``stage_*`` signatures, ``micro_batches`` of each in flight; ``devices`` names each stage's device."""

    stages: int = 1
    micro_batches: int = 4
    devices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        positive_int("stages", self.stages)
        positive_int("micro_batches", self.micro_batches)
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(self.devices))


@dataclass(frozen=True)
class FrontOptions:
    """The fronts' limits: the largest request body or gRPC message, how long stopping waits for
    requests in flight, and the threads running unbatched requests."""

    max_request_bytes: int = 4 << 20
    drain_seconds: float = 10.0
    request_threads: int = 4

    def __post_init__(self) -> None:
        positive_int("max_request_bytes", self.max_request_bytes)
        number("drain_seconds", self.drain_seconds, minimum=0)
        positive_int("request_threads", self.request_threads)
