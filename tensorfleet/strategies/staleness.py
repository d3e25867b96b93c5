"""Consistency models for parameter-server training: BSP, SSP with staleness k, and ASP.

A parameter-server worker reads the variables, computes a gradient and applies it; other
workers' updates may land in between. How far the workers may drift apart is the
consistency model, after Ho et al., "More Effective Distributed ML via a Stale Synchronous
Parallel Parameter Server" (NIPS 2013):

* ``staleness=0`` -- bulk-synchronous (BSP): no worker starts step c+1 before every worker
  has finished step c.
* ``staleness=k`` -- stale-synchronous (SSP): a worker may run at most k steps ahead of the
  slowest one (it starts its next step only while ``its clock - slowest clock <= k``).
* ``staleness=None`` -- fully asynchronous (ASP): every worker runs as fast as it can, the
  behaviour of ``ClusterCoordinator.schedule``.

The rule is enforced on TensorFlow's own :class:`ClusterCoordinator`: each step is sent to one
chosen worker through the coordinator's per-worker closure queue (the queue it uses to build
per-worker datasets), and a driver thread per worker holds the worker's next step back until
the policy allows it. Works on any ``tf.distribute.experimental.ParameterServerStrategy`` and
its coordinator that the caller passes in:

* :func:`attach` (strategy, staleness) -- the ``staleness`` option of a strategy: gates the
  strategy's one ``ClusterCoordinator``, so Keras ``Model.fit`` trains under the policy;
* :func:`install` (coordinator, staleness) -- the same on a coordinator;
* :class:`StalenessScheduler` -- runs a step function on the workers under the policy;
  :func:`tensorfleet.strategies.staleness_run.train` builds a measured training loop (clock gaps,
  update lags, weight snapshots, an optional straggler) on it for comparing the policies.

Example:
    >>> from tensorfleet.strategies import staleness as consistency
    >>> policy = consistency.resolve_staleness(2)
    >>> policy.kind, policy.may_start([5, 3, 4], worker=0), policy.may_start([6, 3, 4], worker=0)
    (<Consistency.SSP: 'ssp'>, True, False)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Sequence

from tensorfleet.validation import positive_int

__all__ = [
    "Consistency",
    "StalenessPolicy",
    "StalenessScheduler",
    "StepRecord",
    "StalenessGate",
    "attach",
    "install",
    "installed_gate",
    "resolve_staleness",
]


class Consistency(str, Enum):
    """The three consistency models."""

    BSP = "bsp"
    SSP = "ssp"
    ASP = "asp"


_ASP_WORDS = ("none", "asp", "async", "inf", "infinite")


@dataclass(frozen=True)
class StalenessPolicy:
    """How many steps a worker may run ahead of the slowest: ``0`` BSP, ``k`` SSP, ``None`` ASP."""

    staleness: int | None

    @property
    def kind(self) -> Consistency:
        if self.staleness is None:
            return Consistency.ASP
        return Consistency.BSP if self.staleness == 0 else Consistency.SSP

    @property
    def label(self) -> str:
        """``"BSP"``, ``"SSP k=2"`` or ``"ASP"``."""
        return f"SSP k={self.staleness}" if self.kind is Consistency.SSP else self.kind.value.upper()

    def may_start(self, clocks: Sequence[int], worker: int) -> bool:
        """Whether ``worker`` may start its next step, given every worker's finished steps."""
        if self.staleness is None:
            return True
        return clocks[worker] - min(clocks) <= self.staleness


def resolve_staleness(staleness: int | str | None) -> StalenessPolicy:
    """Reads a ``staleness`` option: an int k >= 0, ``None``/``"none"``/``"asp"``, or ``"bsp"``.

    Args:
        staleness: 0 for BSP, k > 0 for SSP, None (or "none", "asp", "inf") for ASP; digit
            strings as from a command line are accepted.

    Returns:
        The :class:`StalenessPolicy`.

    Example:
        >>> resolve_staleness(None).label, resolve_staleness("bsp").label, resolve_staleness("8").label
        ('ASP', 'BSP', 'SSP k=8')
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
            return StalenessPolicy(0)
        if word.isdigit():
            return StalenessPolicy(int(word))
        raise ValueError(
            "staleness must be an integer >= 0 (0 = BSP, k = SSP) or None/'none' (ASP). "
            f"Received: staleness={staleness!r}"
        )
    if isinstance(staleness, bool) or not isinstance(staleness, int):
        raise TypeError(
            "staleness must be an integer >= 0 (0 = BSP, k = SSP) or None (ASP). "
            f"Received: staleness={staleness!r} of type {type(staleness).__name__}"
        )
    if staleness < 0:
        raise ValueError(
            f"staleness must be an integer >= 0 (0 = BSP, k = SSP) or None (ASP). Received: staleness={staleness}"
        )
    return StalenessPolicy(staleness)


@dataclass
class StepRecord:
    """One executed step: which worker, its clock, how far ahead it was, when, what it returned."""

    worker: int
    clock: int
    clock_gap: int
    start: float
    end: float
    outputs: Any = None


def _coordinator_workers(coordinator: Any) -> list[Any]:
    """The workers of a ``ClusterCoordinator``; TypeError for anything else."""
    workers = getattr(getattr(coordinator, "_cluster", None), "workers", None)
    if not workers:
        raise TypeError(
            "coordinator must be a tf.distribute.experimental.coordinator.ClusterCoordinator. "
            f"Received: {type(coordinator).__name__}"
        )
    return list(workers)


class StalenessScheduler:
    """Runs steps on a ``ClusterCoordinator``'s workers under a :class:`StalenessPolicy`.

    Args:
        coordinator: a ``tf.distribute.experimental.coordinator.ClusterCoordinator``.
        staleness: 0 (BSP), k (SSP), None (ASP), or a :class:`StalenessPolicy`.

    Example (needs a ParameterServerStrategy cluster and its ClusterCoordinator, so it does not
    run as a doctest: connecting to a cluster changes the process's eager context for good):
        >>> coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)  # doctest: +SKIP
        >>> scheduler = StalenessScheduler(coordinator, staleness=2)  # doctest: +SKIP
        >>> records = scheduler.run(step_fn, steps=100, args_for=lambda w: (iterator, w))  # doctest: +SKIP
        >>> max(record.clock_gap for record in records) <= 2  # doctest: +SKIP
        True
    """

    def __init__(self, coordinator: Any, staleness: int | str | None | StalenessPolicy) -> None:
        self._workers = _coordinator_workers(coordinator)
        self.coordinator = coordinator
        self.policy = resolve_staleness(staleness)

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    def run(
        self,
        fn: Callable[..., Any],
        *,
        steps: int,
        args_for: Callable[[int], tuple[Any, ...]] = lambda worker: (),
        progress: bool = True,
        description: str | None = None,
    ) -> list[StepRecord]:
        """Runs ``steps`` steps of ``fn`` in all, each on one worker, honouring the policy.

        Args:
            fn: a ``tf.function`` run on a worker (as with ``ClusterCoordinator.schedule``).
            steps: total steps over all workers.
            args_for: the arguments of a step on worker ``w``; per-worker values (datasets'
                iterators) are resolved to that worker's own.
            progress: show a tqdm bar.
            description: the bar's label (default the policy's label).

        Returns:
            One :class:`StepRecord` per step, in order of completion.
        """
        import numpy as np
        from tqdm.auto import tqdm

        positive_int("steps", steps)
        n = self.num_workers
        clocks = [0] * n
        issued = [0]
        records: list[StepRecord] = []
        errors: list[BaseException] = []
        condition = threading.Condition()
        bar = tqdm(total=steps, desc=description or self.policy.label, disable=not progress, leave=False)

        def drive(w: int) -> None:
            worker = self._workers[w]
            while True:
                with condition:
                    condition.wait_for(lambda: errors or issued[0] >= steps or self.policy.may_start(clocks, w))
                    if errors or issued[0] >= steps:
                        return
                    issued[0] += 1
                    gap = clocks[w] - min(clocks)
                start = time.perf_counter()
                try:
                    remote = worker.create_resource(fn, args=args_for(w))
                    outputs = _to_numpy(remote.fetch(), np)
                    del remote
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                    with condition:
                        errors.append(exc)
                        condition.notify_all()
                    return
                end = time.perf_counter()
                with condition:
                    records.append(StepRecord(worker=w, clock=clocks[w], clock_gap=gap, start=start, end=end,
                                              outputs=outputs))
                    clocks[w] += 1
                    condition.notify_all()
                bar.update(1)

        threads = [threading.Thread(target=drive, args=(w,), name=f"staleness-driver-{w}", daemon=True)
                   for w in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        bar.close()
        if errors:
            raise errors[0]
        return records


# Where install() keeps a coordinator's gate: ClusterCoordinator is one object per strategy.
_GATE_ATTRIBUTE = "_tensorfleet_staleness_gate"


class StalenessGate:
    """Makes a ``ClusterCoordinator``'s own ``schedule`` obey a :class:`StalenessPolicy`.

    Installed by :func:`install`. Each scheduled function runs on one chosen worker through
    the coordinator's per-worker queue, one at a time per worker; ``schedule`` blocks until
    some idle worker may start under the policy (the least advanced one is chosen), and
    ``join`` first waits for every step it dispatched. Everything that schedules through the
    coordinator -- Keras ``Model.fit`` under a ``ParameterServerStrategy`` included -- then
    trains under BSP or SSP.
    """

    def __init__(self, coordinator: Any, policy: StalenessPolicy) -> None:
        self.coordinator = coordinator
        self.policy = policy
        self._workers = _coordinator_workers(coordinator)
        self._schedule = coordinator.schedule
        self._join = coordinator.join
        self.clocks = [0] * len(self._workers)
        self.busy = [False] * len(self._workers)
        self.gaps: list[tuple[int, int]] = []  # (worker, clock gap) of every dispatched step
        self._errors: list[BaseException] = []
        self._condition = threading.Condition()

    def _can_start(self, w: int) -> bool:
        return not self.busy[w] and self.policy.may_start(self.clocks, w)

    def schedule(self, fn: Callable[..., Any], args: Any = None, kwargs: Any = None) -> Any:
        """Dispatches ``fn`` to a worker the policy allows; returns its ``RemoteValue``."""
        with self._condition:
            self._condition.wait_for(lambda: self._errors or any(self._can_start(w) for w in range(len(self.busy))))
            self._raise_if_failed()
            w = min((w for w in range(len(self.busy)) if self._can_start(w)), key=lambda w: (self.clocks[w], w))
            self.busy[w] = True
            self.gaps.append((w, self.clocks[w] - min(self.clocks)))
        remote = self._workers[w].create_resource(fn, args=args, kwargs=kwargs)
        threading.Thread(target=self._watch, args=(w, remote), name=f"staleness-watch-{w}", daemon=True).start()
        return remote

    def _watch(self, w: int, remote: Any) -> None:
        try:
            remote.get()
        except BaseException as exc:  # noqa: BLE001 - surfaced by schedule() and join()
            with self._condition:
                self._errors.append(exc)
        with self._condition:
            self.busy[w] = False
            self.clocks[w] += 1
            self._condition.notify_all()

    def _raise_if_failed(self) -> None:
        if self._errors:
            error, self._errors = self._errors[0], []
            raise error

    def join(self) -> None:
        """Waits for every dispatched step, then for the coordinator's own queue."""
        with self._condition:
            self._condition.wait_for(lambda: not any(self.busy))
            self._raise_if_failed()
        self._join()

    def uninstall(self) -> None:
        """Gives the coordinator its own ``schedule`` and ``join`` back."""
        self.join()
        for name in ("schedule", "join", _GATE_ATTRIBUTE):
            self.coordinator.__dict__.pop(name, None)


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
    installed and None is returned.

    Args:
        coordinator: ``tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)``.
        staleness: 0 BSP, k SSP, None ASP.

    Returns:
        The installed :class:`StalenessGate` (its ``gaps`` record every step), or None for ASP.

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
    _coordinator_workers(coordinator)
    previous = installed_gate(coordinator)
    if previous is not None:
        previous.uninstall()
    if policy.kind is Consistency.ASP:
        return None
    gate = StalenessGate(coordinator, policy)
    coordinator.schedule = gate.schedule
    coordinator.join = gate.join
    setattr(coordinator, _GATE_ATTRIBUTE, gate)
    return gate


def attach(strategy: Any, staleness: int | str | None | StalenessPolicy) -> StalenessGate | None:
    """Puts a ``ParameterServerStrategy`` under a consistency model: the ``staleness`` option.

    Validates ``staleness`` first (a bad value raises before anything starts). For BSP and SSP
    it creates the strategy's ``ClusterCoordinator`` (one per strategy; Keras ``fit`` reuses
    it) and installs the gate on it (:func:`install`); for ASP (None) it does nothing, which is the
    coordinator's own behaviour.

    Args:
        strategy: a ``tf.distribute.experimental.ParameterServerStrategy``.
        staleness: 0 BSP, k SSP, None ASP.

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
        ValueError: staleness must be an integer >= 0 (0 = BSP, k = SSP) or None (ASP). Received: staleness=-1
        >>> attach(tf.distribute.get_strategy(), staleness=2)
        Traceback (most recent call last):
        ...
        TypeError: staleness applies to a tf.distribute.experimental.ParameterServerStrategy. Received: ...
    """
    policy = resolve_staleness(staleness)
    if not getattr(strategy, "_should_use_with_coordinator", False):
        raise TypeError(
            "staleness applies to a tf.distribute.experimental.ParameterServerStrategy. "
            f"Received: {type(strategy).__name__}"
        )
    if policy.kind is Consistency.ASP:
        return None
    import tensorflow as tf

    return install(tf.distribute.experimental.coordinator.ClusterCoordinator(strategy), policy)


def _to_numpy(value: Any, np: Any) -> Any:
    import tensorflow as tf

    return tf.nest.map_structure(lambda v: np.asarray(v), value)
