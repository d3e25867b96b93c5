"""Hooks for tensorfleet's own tests and benchmarks: fault injection, slowed inputs, equal shares,
decomposition at full rank, and the experiments behind benchmarks.

**Not the user API**: what is here may change or go without deprecation, and the reference does
not document it. The library's public signatures (``launch``'s :class:`~tensorfleet.cluster.Recovery`,
``migrate``, :class:`~tensorfleet.cluster.migration.RunOptions`, the tuning search's ``Supervision``,
``edge.decompose``) carry none of these; each setting is made here, for a ``with`` block, and
read by the library's code through :mod:`tensorfleet.testing.hooks`, so production runs the same
code paths with the hooks at their defaults:

* :func:`faults` -- the launcher injects these :class:`Fault` s into every job launched in the
  block (``launch``, ``migrate``, ``share``, a distributed tuning search);
* :func:`slow_inputs` -- a migratable job's replicas wait per example (heterogeneous workers);
* :func:`equal_shares` -- a migratable job under a parameter server steps in joined rounds of one
  step per worker (the equal static split, to compare the coordinator's dispatch with);
* :func:`allow_growth` -- decomposition factors layers even where the factors are larger;
* :mod:`~tensorfleet.testing.staleness_run` -- a measured parameter-server run under a consistency
  model, with a straggler (``bench/consistency_straggler.py``).

Example:
    >>> from tensorfleet import testing
    >>> with testing.faults(testing.Fault("worker:1", r"epoch 3 step 2")):
    ...     testing.hooks.active().faults[0].task
    'worker:1'
    >>> testing.hooks.active().faults
    ()
    >>> with testing.faults(testing.Fault("worker1", "x")):
    ...     pass
    Traceback (most recent call last):
    ValueError: A task is named 'role:index', e.g. 'worker:1'. Received: 'worker1'
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator, Sequence

from tensorfleet.lazy import attach
from tensorfleet.testing import hooks
from tensorfleet.testing.hooks import Fault, Hooks
from tensorfleet.validation import number

__getattr__, _LAZY = attach(__name__, modules=("staleness_run",))

__all__ = ["Fault", "Hooks", "allow_growth", "equal_shares", "faults", "hooks", "slow_inputs", *_LAZY]


def _check_task_name(name: str) -> None:
    if not isinstance(name, str) or not re.fullmatch(r"(chief|worker|ps|evaluator|tuner):(\d+)", name):
        raise ValueError(f"A task is named 'role:index', e.g. 'worker:1'. Received: {name!r}")


@contextlib.contextmanager
def faults(*injected: Fault) -> Iterator[Hooks]:
    """Every job launched in the block gets ``injected`` (each fires once per job); a distributed tuning
    search's tasks are ``chief:0`` and ``tuner:I``."""
    for fault in injected:
        if not isinstance(fault, Fault):
            raise TypeError(f"faults takes Fault objects. Received: {fault!r}")
        _check_task_name(fault.task)
        if fault.watch is not None:
            _check_task_name(fault.watch)
    with hooks.using(faults=tuple(injected)) as active:
        yield active


@contextlib.contextmanager
def slow_inputs(delay: float, slowdown: Sequence[float] | None = None) -> Iterator[Hooks]:
    """A migratable job started in the block waits ``delay`` seconds per example of each replica's input,
    times the replica's factor in ``slowdown`` (default 1 for every replica; replicas past its end: 1)."""
    number("delay", delay, minimum=0)
    factors = None
    if slowdown is not None:
        factors = tuple(number(f"slowdown[{i}]", f, above=0) for i, f in enumerate(slowdown))
    with hooks.using(input_delay=float(delay), slowdown=factors) as active:
        yield active


@contextlib.contextmanager
def equal_shares() -> Iterator[Hooks]:
    """A migratable job started in the block under a parameter server (without ``balance``) steps in rounds
    of one step per worker, each round joined: every worker reads an equal share of each epoch once."""
    with hooks.using(equal_shares=True) as active:
        yield active


@contextlib.contextmanager
def allow_growth() -> Iterator[Hooks]:
    """Decomposition in the block factors layers even where the factors have more parameters."""
    with hooks.using(allow_growth=True) as active:
        yield active
