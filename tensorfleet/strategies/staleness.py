"""Consistency models for parameter-server training: stale-synchronous (SSP) with a staleness
bound k, and fully asynchronous (ASP).

A parameter-server worker reads the variables, computes a gradient and applies it; other
workers' updates may land in between. How far the workers may drift apart is the
consistency model, after Ho et al., "More Effective Distributed ML via a Stale Synchronous
Parallel Parameter Server" (NIPS 2013). A worker's clock is the number of steps it finished.

* ``staleness=k`` (k >= 0) -- SSP: a worker starts its next step only while its clock is at
  most k ahead of the slowest worker's.
* ``staleness=0`` -- SSP with k=0: the clocks move in lockstep, no worker starts step c+1
  before every worker finished step c. This is **not** bulk-synchronous training (BSP): each
  worker's update is applied on its own as it arrives, not summed with the other workers'
  updates of the same clock and applied once. A worker's step-c gradient is computed on
  variables that hold every update of clocks before c and possibly some of clock c (the update
  lag is at most ``workers - 1``); with Adam or momentum, W separate updates are not one
  averaged update. Synchronous training that aggregates every replica's gradient before one
  update is ``multi_worker_mirrored`` (or ``mirrored`` on one machine).
* ``staleness=None`` -- ASP: every worker runs as fast as it can, the behaviour of
  ``ClusterCoordinator.schedule``.

The rule is enforced on TensorFlow's own :class:`ClusterCoordinator`, without replacing its
``schedule`` or ``join``: steps still go into the coordinator's queue, and a worker's thread is
held back before it takes its next step from the queue until the policy allows it. The
coordinator's failure handling therefore works unchanged: a step whose worker fails is put
back into the queue and run again by another worker (or by the same one when it is back),
exactly as without a gate. Whilst a worker is down it does not count as the slowest; when it is
back, its clock rejoins at the slowest clock of the others.

Steps are at-least-once, as ``ClusterCoordinator.schedule`` documents: a step whose worker
dies after its update reached the parameter servers (in full or in part) but before the
coordinator got its reply is run again. Each worker runs one step at a time, so each worker
failure repeats at most one step: a run with F worker failures applies between N and N + F
updates for N planned steps.

Works on any ``tf.distribute.experimental.ParameterServerStrategy`` and its coordinator:

* :func:`attach` (strategy, staleness) -- the ``staleness`` option of a strategy: gates the
  strategy's one ``ClusterCoordinator``, so Keras ``Model.fit`` trains under the policy;
* :func:`install` (coordinator, staleness) -- the same on a coordinator;
* :class:`~tensorfleet.testing.staleness_run.StalenessScheduler` (tensorfleet's own tests and
  benchmarks, not the user API) -- runs a step function on the workers under the policy and
  records every step; :func:`tensorfleet.testing.staleness_run.train` builds a measured training
  loop (clock gaps, update lags, weight snapshots, an optional straggler) on it.

Example:
    >>> from tensorfleet.strategies import staleness as consistency
    >>> policy = consistency.resolve_staleness(2)
    >>> policy.kind, policy.may_start([5, 3, 4], worker=0), policy.may_start([6, 3, 4], worker=0)
    (<Consistency.SSP: 'ssp'>, True, False)
    >>> consistency.resolve_staleness(0).label
    'SSP k=0'
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

from tensorfleet.compat import distribute as tf_internals

__all__ = ["Consistency", "StalenessPolicy", "StepRecord", "StalenessGate", "attach", "install", "installed_gate",
           "num_workers", "resolve_staleness"]


class Consistency(str, Enum):
    """The consistency models: stale-synchronous (a bound k >= 0) or asynchronous (no bound)."""

    SSP = "ssp"
    ASP = "asp"


_ASP_WORDS = ("none", "asp", "async", "inf", "infinite")
_OPTION = "staleness must be an integer k >= 0 (SSP: at most k steps ahead of the slowest worker) or None (ASP)."


@dataclass(frozen=True)
class StalenessPolicy:
    """How many steps a worker may run ahead of the slowest: ``k`` SSP (0: lockstep), ``None`` ASP."""

    staleness: int | None

    @property
    def kind(self) -> Consistency:
        return Consistency.ASP if self.staleness is None else Consistency.SSP

    @property
    def label(self) -> str:
        """``"SSP k=0"``, ``"SSP k=2"`` or ``"ASP"``."""
        return "ASP" if self.staleness is None else f"SSP k={self.staleness}"

    def may_start(self, clocks: Sequence[int], worker: int) -> bool:
        """Whether ``worker`` may start its next step, given the finished steps of every worker
        that counts (a worker that is down does not)."""
        if self.staleness is None:
            return True
        return clocks[worker] - min(clocks) <= self.staleness


def resolve_staleness(staleness: int | str | StalenessPolicy | None) -> StalenessPolicy:
    """Reads a ``staleness`` option: an int k >= 0, or ``None``/``"none"``/``"asp"``.

    Args:
        staleness: k >= 0 for SSP (0 keeps the workers in lockstep), None (or "none", "asp",
            "inf") for ASP; digit strings as from a command line are accepted. ``"bsp"`` is
            refused: no mode here aggregates the workers' gradients (see the module docstring).

    Returns:
        The :class:`StalenessPolicy`.

    Example:
        >>> resolve_staleness(None).label, resolve_staleness(0).label, resolve_staleness("8").label
        ('ASP', 'SSP k=0', 'SSP k=8')
    """
    if isinstance(staleness, StalenessPolicy):
        return staleness
    if staleness is None:
        return StalenessPolicy(None)
    if isinstance(staleness, str):
        word = staleness.strip().lower()
        if word in _ASP_WORDS:
            return StalenessPolicy(None)
        if word == "bsp":
            raise ValueError(
                "staleness='bsp' is not offered: the parameter server applies each worker's update on its "
                "own. staleness=0 keeps the workers' clocks in lockstep (SSP k=0) but does not sum the "
                "updates of a clock into one; for synchronous training that aggregates every replica's "
                "gradient, use the multi_worker_mirrored strategy. Received: staleness='bsp'"
            )
        if word.isdigit():
            return StalenessPolicy(int(word))
        raise ValueError(f"{_OPTION} Received: staleness={staleness!r}")
    if isinstance(staleness, bool) or not isinstance(staleness, int):
        raise TypeError(f"{_OPTION} Received: staleness={staleness!r} of type {type(staleness).__name__}")
    if staleness < 0:
        raise ValueError(f"{_OPTION} Received: staleness={staleness}")
    return StalenessPolicy(staleness)


@dataclass
class StepRecord:
    """One finished step: which worker ran it, its clock, how far ahead it was, when, what it returned.

    ``start`` and ``end`` are ``time.perf_counter()`` values: when the worker took the step from
    the queue, and when the coordinator had its reply. ``outputs`` is the step's ``RemoteValue``
    in a :class:`StalenessGate`'s records and its fetched value in a
    :class:`~tensorfleet.testing.staleness_run.StalenessScheduler`'s.
    """

    worker: int
    clock: int
    clock_gap: int
    start: float
    end: float
    outputs: Any = None


def _coordinator_cluster(coordinator: Any) -> Any:
    """The ``Cluster`` of a ``ClusterCoordinator``; TypeError for anything else."""
    cluster = tf_internals.coordinator_cluster(coordinator)
    if not getattr(cluster, "workers", None) or getattr(cluster, "closure_queue", None) is None:
        raise TypeError(
            "coordinator must be a tf.distribute.experimental.coordinator.ClusterCoordinator. "
            f"Received: {type(coordinator).__name__}"
        )
    return cluster


def num_workers(coordinator: Any) -> int:
    """How many workers a ``ClusterCoordinator`` drives; TypeError for anything else.

    Example:
        >>> num_workers(object())
        Traceback (most recent call last):
        ...
        TypeError: coordinator must be a tf.distribute.experimental.coordinator.ClusterCoordinator. Received: object
    """
    return len(_coordinator_cluster(coordinator).workers)


# Where install() keeps a coordinator's gate: ClusterCoordinator is one object per strategy.
_GATE_ATTRIBUTE = "_tensorfleet_staleness_gate"
# The closure queue's methods the gate wraps (instance attributes shadow the class's).
_WRAPPED = ("get", "put", "mark_finished", "put_back", "mark_failed")
# A held-back worker re-checks at least this often (the queue's stop() does not notify it).
_HELD_POLL_SECONDS = 0.5


def _no_op() -> None:
    return None


class StalenessGate:
    """Makes a ``ClusterCoordinator``'s workers obey a :class:`StalenessPolicy`.

    Installed by :func:`install`. The coordinator's ``schedule`` and ``join`` are TensorFlow's
    own; the gate wraps the coordinator's closure queue. When a worker's thread asks the queue
    for its next step, the gate holds it until the policy allows that worker to start (work
    tagged for that worker alone, such as rebuilding its datasets after a failure, passes at
    once). A step the worker finishes advances its clock; a step the coordinator puts back
    because the worker failed does not, and the worker stops counting as the slowest until it
    asks for work again. Everything that schedules through the coordinator -- Keras
    ``Model.fit`` under a ``ParameterServerStrategy`` included -- then trains under the policy,
    with the coordinator's retries on worker failure.

    Attributes:
        clocks: each worker's clock: the steps it finished, except that a worker back from a
            failure rejoins at the slowest other worker's clock.
        finished: steps finished per worker.
        gaps: ``(worker, clock gap)`` of every step a worker started, in order.
        records: a :class:`StepRecord` per finished step, in order of completion (with its
            ``RemoteValue`` as ``outputs`` when ``keep_outputs``).
        retried: the worker of every step that was put back to run again (a failure).
        held_back: how many worker threads the policy holds back now.
    """

    def __init__(self, coordinator: Any, policy: StalenessPolicy, *, keep_outputs: bool = False) -> None:
        cluster = _coordinator_cluster(coordinator)
        self.coordinator = coordinator
        self.policy = policy
        self._keep_outputs = keep_outputs
        self._queue = cluster.closure_queue
        n = len(cluster.workers)
        self.clocks = [0] * n
        self.finished = [0] * n
        self.gaps: list[tuple[int, int]] = []
        self.records: list[StepRecord] = []
        self.retried: list[int] = []
        self._down = [False] * n
        self._running: dict[int, tuple[Any, int, int, int, float]] = {}  # thread -> step being run
        # Held-back workers wait on a condition of their own, on the queue's lock: the queue wakes
        # one waiter per step it is given, and that must be a worker that may take it.
        self._lock = tf_internals.closure_queue_lock(self._queue)
        self._held = threading.Condition(self._lock)
        self._active = True
        self._originals = {name: getattr(self._queue, name) for name in _WRAPPED}
        self._queue.get = self._get
        self._queue.put = self._put
        self._queue.mark_finished = self._mark_finished
        self._queue.put_back = self._put_back
        self._queue.mark_failed = self._mark_failed
        self._nudge(cluster)

    @property
    def held_back(self) -> int:
        with self._lock:
            return tf_internals.condition_waiters(self._held)

    def _nudge(self, cluster: Any) -> None:
        """Gives every worker a no-op of its own: a worker thread already waiting in the queue's
        ``get`` (it started waiting before the gate was installed) takes it and comes back for
        its next step through the gate."""
        for w in range(len(self.clocks)):
            self._queue.put(tf_internals.worker_closure(_no_op, cluster), tag=w)

    # ------------------------------------------------------------------ policy (lock held)

    def _counted(self) -> list[int]:
        """The workers that count for "the slowest": all but those that are down."""
        return [w for w in range(len(self.clocks)) if not self._down[w]]

    def _gap(self, w: int) -> int:
        return self.clocks[w] - min(self.clocks[v] for v in self._counted() + [w])

    def _may_start(self, w: int) -> bool:
        return self.policy.staleness is None or self._gap(w) <= self.policy.staleness

    def _back(self, w: int) -> None:
        """Worker ``w`` asks for work after a failure: it counts again, as the slowest at most."""
        self._down[w] = False
        others = [self.clocks[v] for v in self._counted() if v != w]
        if others:
            self.clocks[w] = max(self.clocks[w], min(others))

    # ------------------------------------------------------------------ the queue's methods

    def _get(self, timeout: float | None = None, tag: Any = None) -> Any:
        get = self._originals["get"]
        if tag is None:
            return get(timeout=timeout, tag=tag)
        w = tag
        queue = self._queue
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._down[w]:
                self._back(w)
            while (self._active and tf_internals.queue_accepts_closures(queue)
                   and not tf_internals.tagged_work_waiting(queue, w) and not self._may_start(w)):
                remaining = _HELD_POLL_SECONDS if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._held.wait(min(remaining, _HELD_POLL_SECONDS))
        closure = get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()), tag=tag)
        if closure is not None and closure.tag is None:  # a step from the shared queue, not w's own work
            with self._lock:
                gap = self._gap(w)
                self.gaps.append((w, gap))
                self._running[threading.get_ident()] = (closure, w, self.clocks[w], gap, time.perf_counter())
        return closure

    def _put(self, closure: Any, tag: Any = None) -> None:
        self._originals["put"](closure, tag=tag)
        if tag is not None:  # work for one worker: it passes the gate even when held back
            with self._lock:
                self._held.notify_all()

    def _mark_finished(self) -> None:
        step = self._running.pop(threading.get_ident(), None)
        if step is not None:
            closure, w, clock, gap, start = step
            remote = tf_internals.closure_output(closure) if self._keep_outputs else None
            with self._lock:
                self.records.append(StepRecord(worker=w, clock=clock, clock_gap=gap, start=start,
                                                end=time.perf_counter(), outputs=remote))
                self.clocks[w] += 1
                self.finished[w] += 1
                self._held.notify_all()
        self._originals["mark_finished"]()

    def _put_back(self, closure: Any) -> None:
        step = self._running.pop(threading.get_ident(), None)
        if step is not None:
            w = step[1]
            with self._lock:
                self.retried.append(w)
                self._down[w] = True  # until its thread asks for work again (recovered, or at once)
                self._held.notify_all()
        self._originals["put_back"](closure)

    def _mark_failed(self, error: BaseException) -> None:
        self._running.pop(threading.get_ident(), None)
        with self._lock:
            self._held.notify_all()
        self._originals["mark_failed"](error)

    # ------------------------------------------------------------------ lifecycle

    def uninstall(self, *, wait: bool = True) -> None:
        """Gives the queue its own methods back, after waiting for the scheduled steps (``join``)
        unless ``wait`` is false."""
        if wait:
            self.coordinator.join()
        for name in _WRAPPED:
            self._queue.__dict__.pop(name, None)
        with self._lock:
            self._active = False
            self._held.notify_all()
        self.coordinator.__dict__.pop(_GATE_ATTRIBUTE, None)


def installed_gate(coordinator: Any) -> StalenessGate | None:
    """The :class:`StalenessGate` installed on ``coordinator`` (None under ASP or when none is).

    ``ClusterCoordinator(strategy)`` returns the strategy's one coordinator, the one that
    :func:`attach` (the ``staleness`` option) and Keras ``fit`` use.
    """
    return coordinator.__dict__.get(_GATE_ATTRIBUTE)


def install(coordinator: Any, staleness: int | str | None | StalenessPolicy) -> StalenessGate | None:
    """Puts a ``ClusterCoordinator`` under a consistency model, for ``fit`` and custom loops.

    ``ClusterCoordinator`` is one object per strategy, so Keras ``Model.fit`` picks up the
    installed gate. ASP (``staleness=None``) is the coordinator's own behaviour: nothing is
    installed and None is returned. A gate installed before is removed first.

    Args:
        coordinator: ``tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)``.
        staleness: k >= 0 SSP (0: lockstep), None ASP.

    Returns:
        The installed :class:`StalenessGate` (its ``gaps`` and ``records`` record every step), or
        None for ASP.

    Example (needs a ParameterServerStrategy cluster and its ClusterCoordinator, so it does not
    run as a doctest: connecting to a cluster changes the process's eager context for good):
        >>> coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)  # doctest: +SKIP
        >>> gate = install(coordinator, staleness=2)  # doctest: +SKIP
        >>> history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn),  # doctest: +SKIP
        ...                     epochs=2, steps_per_epoch=50)
        >>> max(gap for _, gap in gate.gaps) <= 2  # doctest: +SKIP
        True
    """
    policy = resolve_staleness(staleness)
    _coordinator_cluster(coordinator)
    previous = installed_gate(coordinator)
    if previous is not None:
        previous.uninstall()
    if policy.kind is Consistency.ASP:
        return None
    gate = StalenessGate(coordinator, policy)
    setattr(coordinator, _GATE_ATTRIBUTE, gate)
    return gate


def attach(strategy: Any, staleness: int | str | None | StalenessPolicy) -> StalenessGate | None:
    """Puts a ``ParameterServerStrategy`` under a consistency model: the ``staleness`` option.

    Validates ``staleness`` first (a bad value raises before anything starts). For SSP it
    creates the strategy's ``ClusterCoordinator`` (one per strategy; Keras ``fit`` reuses it)
    and installs the gate on it (:func:`install`); for ASP (None) it does nothing, which is the
    coordinator's own behaviour.

    Args:
        strategy: a ``tf.distribute.experimental.ParameterServerStrategy``.
        staleness: k >= 0 SSP (0: lockstep), None ASP.

    Returns:
        The :class:`StalenessGate`, or None for ASP.

    Example (needs a ParameterServerStrategy cluster, here one started in this process, so it
    does not run as a doctest: connecting to a cluster changes the process's eager context for
    good):
        >>> import tensorflow as tf
        >>> import tensorfleet as tfl
        >>> spec = tfl.strategies.start_in_process_cluster(workers=2, ps=1)  # doctest: +SKIP
        >>> strategy = tfl.strategies.build("parameter_server", cluster=spec)  # doctest: +SKIP
        >>> gate = attach(strategy, staleness=2)  # doctest: +SKIP
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = tfl.models.build("digits_cnn")
        ...     model.compile(optimizer="sgd",
        ...                   loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn),  # doctest: +SKIP
        ...                     epochs=3, steps_per_epoch=50)

    Without a cluster, a bad ``staleness`` or a strategy of another kind is refused before
    anything starts:
        >>> attach(tf.distribute.get_strategy(), staleness=-1)
        Traceback (most recent call last):
        ...
        ValueError: staleness must be an integer k >= 0 (SSP: ...) or None (ASP). Received: staleness=-1
        >>> attach(tf.distribute.get_strategy(), staleness=2)
        Traceback (most recent call last):
        ...
        TypeError: staleness applies to a tf.distribute.experimental.ParameterServerStrategy. Received: ...
    """
    policy = resolve_staleness(staleness)
    if not tf_internals.uses_coordinator(strategy):
        raise TypeError(
            "staleness applies to a tf.distribute.experimental.ParameterServerStrategy. "
            f"Received: {type(strategy).__name__}"
        )
    if policy.kind is Consistency.ASP:
        return None
    import tensorflow as tf

    return install(tf.distribute.experimental.coordinator.ClusterCoordinator(strategy), policy)
