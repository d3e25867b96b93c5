"""The hook points: what tensorfleet's library code reads of :mod:`tensorfleet.testing`'s settings.

Not the user API: it may change without deprecation. This module is the only part of
``tensorfleet.testing`` a library room may import (``tests/test_layout.py``), and it imports no
tensorfleet module itself, so reading a hook costs the library nothing. The settings are made
with the context managers of :mod:`tensorfleet.testing`; the library reads :func:`active`:

* the launcher (:class:`~tensorfleet.cluster.processes.LocalJob`) injects ``faults``;
* :func:`~tensorfleet.cluster.migration.migrate` hands ``input_delay``, ``slowdown`` and
  ``equal_shares`` to its tasks in their options (the job contract,
  :class:`~tensorfleet.cluster.migration.TaskOptions`), where
  :mod:`~tensorfleet.cluster.resumable` reads them;
* :func:`~tensorfleet.edge.decompose.plan_decomposition` reads ``allow_growth``.

The settings are a context variable's: a ``with`` block sets them for the thread (or asyncio task)
that runs it, so jobs launched at once from several threads each get their own. The library reads
them where a job is made, in the caller's thread (``launch``, ``migrate``, ``plan_decomposition``),
and the threads it starts to run jobs (:func:`~tensorfleet.cluster.multiplex.share`) carry the
caller's context.
"""

from __future__ import annotations

import contextlib
import contextvars
import signal
from dataclasses import dataclass, replace
from typing import Any, Iterator

__all__ = ["Fault", "Hooks", "active", "using"]


@dataclass(frozen=True)
class Fault:
    """A fault to inject, for tests and benchmarks of recovery.

    When task ``watch`` (default: ``task`` itself) prints a line matching ``when`` during
    attempt ``attempt``, the launcher sends ``signal`` to the process group of ``task``
    (``"worker:1"``), ``delay`` seconds later.
    """

    task: str
    when: str
    signal: int = signal.SIGKILL
    attempt: int = 0
    watch: str | None = None
    delay: float = 0.0


@dataclass(frozen=True)
class Hooks:
    """Every hook's setting; the defaults are production's (nothing injected, nothing slowed)."""

    #: Faults the launcher injects into every job it launches while set.
    faults: tuple[Fault, ...] = ()
    #: Seconds a migratable job's replica input waits per example, times its ``slowdown`` factor.
    input_delay: float = 0.0
    slowdown: tuple[float, ...] | None = None
    #: Under a parameter server: steps in rounds of one per worker, each round joined.
    equal_shares: bool = False
    #: Factor layers even where the factors have more parameters (decomposition at full rank).
    allow_growth: bool = False


_ACTIVE: contextvars.ContextVar[Hooks] = contextvars.ContextVar("tensorfleet_testing_hooks", default=Hooks())


def active() -> Hooks:
    """The settings in force now, in this context."""
    return _ACTIVE.get()


@contextlib.contextmanager
def using(**changes: Any) -> Iterator[Hooks]:
    """Sets ``changes`` on the hooks while the block runs; the previous settings come back after it."""
    hooks = replace(_ACTIVE.get(), **changes)
    token = _ACTIVE.set(hooks)
    try:
        yield hooks
    finally:
        _ACTIVE.reset(token)
