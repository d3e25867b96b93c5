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
* :func:`train` -- a measured training loop (clock gaps, update lags, weight snapshots,
  an optional straggler) for comparing the policies.

Example:
    >>> from tensorfleet.strategies import staleness as consistency
    >>> policy = consistency.resolve_staleness(2)
    >>> policy.kind, policy.may_start([5, 3, 4], worker=0), policy.may_start([6, 3, 4], worker=0)
    (<Consistency.SSP: 'ssp'>, True, False)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Sequence

__all__ = [
    "Consistency",
    "StalenessPolicy",
    "StalenessScheduler",
    "StepRecord",
    "StalenessGate",
    "TrainingRun",
    "attach",
    "install",
    "resolve_staleness",
    "train",
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
        workers = getattr(getattr(coordinator, "_cluster", None), "workers", None)
        if not workers:
            raise TypeError(
                "coordinator must be a tf.distribute.experimental.coordinator.ClusterCoordinator. "
                f"Received: {type(coordinator).__name__}"
            )
        self.coordinator = coordinator
        self.policy = resolve_staleness(staleness)
        self._workers = list(workers)

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

        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive integer. Received: steps={steps!r}")
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
        self._workers = list(coordinator._cluster.workers)
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
        for name in ("schedule", "join"):
            self.coordinator.__dict__.pop(name, None)
        self.coordinator.__dict__.pop("_tensorfleet_staleness_gate", None)


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
    workers = getattr(getattr(coordinator, "_cluster", None), "workers", None)
    if not workers:
        raise TypeError(
            "coordinator must be a tf.distribute.experimental.coordinator.ClusterCoordinator. "
            f"Received: {type(coordinator).__name__}"
        )
    previous = coordinator.__dict__.get("_tensorfleet_staleness_gate")
    if previous is not None:
        previous.uninstall()
    if policy.kind is Consistency.ASP:
        return None
    gate = StalenessGate(coordinator, policy)
    coordinator.schedule = gate.schedule
    coordinator.join = gate.join
    coordinator._tensorfleet_staleness_gate = gate
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


@dataclass
class TrainingRun:
    """What :func:`train` measured."""

    policy: StalenessPolicy
    records: list[StepRecord]
    wall_seconds: float
    snapshots: list[tuple[float, list[Any]]] = field(default_factory=list)
    straggler: int | None = None

    @property
    def warmup_seconds(self) -> float:
        """Until every worker finished its first step (tracing and start-up happen there)."""
        firsts: dict[int, float] = {}
        for r in self.records:
            firsts.setdefault(r.worker, r.end)
        return max(firsts.values())

    @property
    def steps_per_second(self) -> float:
        """Steady-state rate: steps finished after the warm-up, per second after it."""
        t0 = self.warmup_seconds
        later = sum(1 for r in self.records if r.end > t0)
        return later / (self.wall_seconds - t0) if self.wall_seconds > t0 else 0.0

    @property
    def update_lags(self) -> list[int]:
        """Per step, how many other updates reached the server between its read and its update."""
        return [int(r.outputs["applied"]) - 1 - int(r.outputs["read"]) for r in self.records]

    @property
    def max_clock_gap(self) -> int:
        """The furthest any worker was ahead of the slowest when it started a step."""
        return max(r.clock_gap for r in self.records)

    def steps_per_worker(self, num_workers: int) -> list[int]:
        return [sum(1 for r in self.records if r.worker == w) for w in range(num_workers)]

    def summary(self) -> dict[str, Any]:
        import numpy as np

        lags = self.update_lags
        return {
            "policy": self.policy.label,
            "steps": len(self.records),
            "wall_seconds": round(self.wall_seconds, 3),
            "steps_per_second": round(self.steps_per_second, 2),
            "max_clock_gap": self.max_clock_gap,
            "mean_update_lag": round(float(np.mean(lags)), 3),
            "max_update_lag": int(max(lags)),
        }


def _sleep_op(microseconds: Any) -> Any:
    """A real pause inside a worker's step (a straggler), without burning CPU."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing as data_testing

    return tf.data.Dataset.range(1).apply(data_testing.sleep(microseconds)).reduce(
        tf.constant(0, tf.int64), lambda total, value: total + value)


def train(
    strategy: Any,
    coordinator: Any,
    *,
    model_fn: Callable[[], Any],
    optimizer_fn: Callable[[], Any],
    dataset_fn: Callable[[Any], Any],
    steps: int,
    staleness: int | str | None,
    straggler: int | None = None,
    straggler_delay: float | Sequence[float] = 0.0,
    snapshot_interval: float | None = None,
    progress: bool = True,
) -> tuple[Any, TrainingRun]:
    """Trains a Keras classifier (logits, integer labels) under a consistency model.

    Args:
        strategy: a ``ParameterServerStrategy``.
        coordinator: its ``ClusterCoordinator``.
        model_fn: builds the Keras model (called under ``strategy.scope()``).
        optimizer_fn: builds the Keras optimizer (called under ``strategy.scope()``).
        dataset_fn: ``input_context -> tf.data.Dataset`` of ``(x, y)`` batches, repeated.
        steps: total training steps over all workers.
        staleness: 0 BSP, k SSP, None ASP (see :func:`resolve_staleness`).
        straggler: index of a worker made slow on purpose, or None.
        straggler_delay: seconds that worker pauses inside every step, between reading the
            variables and applying its update (so its updates really are late); a sequence
            gives the pause of its successive steps, cycling (an intermittent straggler).
        snapshot_interval: every this many seconds, copy the weights (for accuracy against
            wall-clock time); None for no snapshots.
        progress: show a progress bar.

    Returns:
        The trained model and a :class:`TrainingRun` with per-step records.

    Example (needs a ParameterServerStrategy cluster and its ClusterCoordinator, so it does not
    run as a doctest: connecting to a cluster changes the process's eager context for good):
        >>> model, run = train(strategy, coordinator,  # doctest: +SKIP
        ...                    model_fn=lambda: tfl.models.build("digits_cnn"),
        ...                    optimizer_fn=lambda: tf.keras.optimizers.SGD(0.1),
        ...                    dataset_fn=make_dataset, steps=200, staleness=2,
        ...                    straggler=1, straggler_delay=0.05)
        >>> run.summary()["max_clock_gap"] <= 2  # doctest: +SKIP
        True
    """
    import tensorflow as tf

    policy = resolve_staleness(staleness)
    scheduler = StalenessScheduler(coordinator, policy)
    if straggler is not None and (isinstance(straggler, bool) or not isinstance(straggler, int)
                                  or not 0 <= straggler < scheduler.num_workers):
        raise ValueError(
            f"straggler must be a worker index in [0, {scheduler.num_workers}) or None. Received: straggler={straggler!r}"
        )
    pattern = [straggler_delay] if isinstance(straggler_delay, (int, float)) else list(straggler_delay)
    if not pattern or any(isinstance(d, bool) or not isinstance(d, (int, float)) or d < 0 for d in pattern):
        raise ValueError(
            "straggler_delay must be seconds >= 0, or a non-empty sequence of them. "
            f"Received: straggler_delay={straggler_delay!r}"
        )
    if snapshot_interval is not None and not snapshot_interval > 0:
        raise ValueError(f"snapshot_interval must be positive or None. Received: snapshot_interval={snapshot_interval!r}")

    with strategy.scope():
        model = model_fn()
        optimizer = optimizer_fn()
        version = tf.Variable(0, dtype=tf.int64, trainable=False, name="update_count")
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker)

    @tf.function
    def step(iterator: Any, delay_us: Any) -> dict[str, Any]:
        def replica_fn(x: Any, y: Any) -> dict[str, Any]:
            # Timestamps after each phase, on the worker. They also pin the version read to the
            # start of the step: without a worker-side consumer TensorFlow deferred it.
            read = version.read_value()
            with tf.control_dependencies([read]):
                t_read = tf.timestamp()
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
                grads = tape.gradient(loss, model.trainable_variables)
            with tf.control_dependencies([loss, *grads]):
                t_grads = tf.timestamp()
            with tf.control_dependencies([_sleep_op(delay_us), t_grads]):
                grads = [tf.identity(g) for g in grads]
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            # What apply_gradients returns under this strategy does not wait for the variable
            # updates; reads of the variables do (ordered after their assignments).
            with tf.control_dependencies([v.read_value() for v in model.trainable_variables]):
                applied = version.assign_add(1)
            with tf.control_dependencies([applied]):
                t_applied = tf.timestamp()
            return {"loss": loss, "read": read, "applied": applied,
                    "times": tf.stack([t_read, t_grads, t_applied])}

        x, y = next(iterator)
        return strategy.run(replica_fn, args=(x, y))

    pauses = [tf.constant(int(d * 1e6), tf.int64) for d in pattern]
    no_pause = tf.constant(0, tf.int64)
    straggler_steps = [0]

    def args_for(w: int) -> tuple[Any, Any]:
        if w != straggler:
            return iterator, no_pause
        straggler_steps[0] += 1  # only this worker's driver thread touches it
        return iterator, pauses[(straggler_steps[0] - 1) % len(pauses)]

    snapshots: list[tuple[float, list[Any]]] = []
    stop = threading.Event()
    start = time.perf_counter()

    def snapshot_loop() -> None:
        while not stop.wait(snapshot_interval):
            snapshots.append((time.perf_counter() - start, model.get_weights()))

    watcher = None
    if snapshot_interval is not None:
        snapshots.append((0.0, model.get_weights()))
        watcher = threading.Thread(target=snapshot_loop, name="staleness-snapshots", daemon=True)
        watcher.start()
    try:
        records = scheduler.run(step, steps=steps, args_for=args_for, progress=progress)
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
    wall = time.perf_counter() - start
    if snapshot_interval is not None:
        snapshots.append((wall, model.get_weights()))
    for record in records:
        record.start -= start
        record.end -= start
    return model, TrainingRun(policy=policy, records=records, wall_seconds=wall, snapshots=snapshots,
                              straggler=straggler)
