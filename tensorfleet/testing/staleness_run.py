"""A measured parameter-server training run under a consistency model, with an optional straggler.

:func:`train` trains a Keras classifier on a ``ParameterServerStrategy`` cluster through a
:class:`StalenessScheduler` (steps scheduled under a
:class:`~tensorfleet.strategies.staleness.StalenessGate`) and records, for every step, which
worker ran it, how far ahead of the slowest worker it was (the clock gap) and how many other
updates reached the variables between its read and its own update (the update lag). One worker
can be made a straggler: it pauses inside each step between reading the variables and applying
its update, so its updates really arrive late. Comparing staleness bounds (SSP k=0, the lockstep,
and k > 0) with ASP this way is the experiment of Ho et al., "More Effective Distributed ML via a
Stale Synchronous Parallel Parameter Server" (NIPS 2013); ``bench/consistency_straggler.py`` runs
it. Part of :mod:`tensorfleet.testing`: not the user API (users train under a staleness bound with
the strategy's ``staleness`` option, :mod:`tensorfleet.strategies.staleness`).
"""

from __future__ import annotations

import contextlib
import numbers
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from tensorfleet.compat import distribute as tf_internals
from tensorfleet.compat.keras import keras2
from tensorfleet.strategies.staleness import (
    StalenessGate,
    StalenessPolicy,
    StepRecord,
    install,
    installed_gate,
    num_workers,
    resolve_staleness,
)
from tensorfleet.validation import integer, number, positive_int

__all__ = ["StalenessScheduler", "TrainingRun", "train"]


class StalenessScheduler:
    """Runs steps on a ``ClusterCoordinator``'s workers under a :class:`StalenessPolicy`, recording each.

    :meth:`run` schedules the steps through the coordinator under a :class:`StalenessGate`
    (even for ASP, to record them), so a worker failure is handled as TensorFlow handles it: the
    step is run again elsewhere.

    Args:
        coordinator: a ``tf.distribute.experimental.coordinator.ClusterCoordinator``.
        staleness: k >= 0 (SSP; 0 lockstep), None (ASP), or a :class:`StalenessPolicy`.

    Example (needs a ParameterServerStrategy cluster and its ClusterCoordinator, so it does not
    run as a doctest: connecting to a cluster changes the process's eager context for good):
        >>> coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)  # doctest: +SKIP
        >>> scheduler = StalenessScheduler(coordinator, staleness=2)  # doctest: +SKIP
        >>> records = scheduler.run(step_fn, steps=100, args=(per_worker_iterator,))  # doctest: +SKIP
        >>> max(record.clock_gap for record in records) <= 2  # doctest: +SKIP
        True
    """

    def __init__(self, coordinator: Any, staleness: int | str | None | StalenessPolicy) -> None:
        self.num_workers = num_workers(coordinator)
        self.coordinator = coordinator
        self.policy = resolve_staleness(staleness)

    def run(
        self,
        fn: Callable[..., Any],
        *,
        steps: int,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        progress: bool = True,
        description: str | None = None,
    ) -> list[StepRecord]:
        """Runs ``steps`` steps of ``fn`` in all, each on whichever worker the policy lets start.

        Args:
            fn: a ``tf.function``, as for ``ClusterCoordinator.schedule``; per-worker values
                in ``args`` (datasets' iterators) resolve to the running worker's own, and
                ``tf.distribute.coordinator.experimental_get_current_worker_index()`` tells it
                which worker runs it.
            steps: total steps over all workers.
            args, kwargs: the arguments of every step.
            progress: show a tqdm bar.
            description: the bar's label (default the policy's label).

        Returns:
            One :class:`StepRecord` per step, in order of completion, with fetched outputs.
        """
        import numpy as np
        import tensorflow as tf
        from tqdm.auto import tqdm

        positive_int("steps", steps)
        previous = installed_gate(self.coordinator)
        if previous is not None:
            previous.uninstall()
        gate = StalenessGate(self.coordinator, self.policy, keep_outputs=True)
        bar = tqdm(total=steps, desc=description or self.policy.label, disable=not progress, leave=False)
        try:
            # Held until the end: a record keeps its step's RemoteValue only while it lives.
            remotes = [self.coordinator.schedule(fn, args=args, kwargs=kwargs) for _ in range(steps)]
            while not self.coordinator.done():  # raises a step's error, as join() would
                bar.update(len(gate.records) - bar.n)
                time.sleep(0.05)
            self.coordinator.join()
            bar.update(len(gate.records) - bar.n)
        finally:
            bar.close()
            gate.uninstall(wait=False)  # joined above, or failing: the coordinator cancelled the rest
            if previous is not None:
                install(self.coordinator, previous.policy)
        for record in gate.records:
            record.outputs = tf.nest.map_structure(np.asarray, record.outputs.fetch())
        del remotes
        return gate.records


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

    return tf.data.Dataset.range(1).apply(tf_internals.sleep_transformation(microseconds)).reduce(
        tf.constant(0, tf.int64), lambda total, value: total + value)


def _delay_pattern(straggler_delay: float | Sequence[float]) -> list[float]:
    """The straggler's successive pauses in seconds, checked."""
    if isinstance(straggler_delay, (str, float, numbers.Real)):  # float: the type checker narrows by it
        return [number("straggler_delay", straggler_delay, minimum=0)]
    pattern = list(straggler_delay)
    if not pattern:
        raise ValueError("straggler_delay must be seconds >= 0, or a non-empty sequence of them. "
                         f"Received: straggler_delay={straggler_delay!r}")
    return [number(f"straggler_delay[{i}]", delay, minimum=0) for i, delay in enumerate(pattern)]


def _measured_step(strategy: Any, model: Any, optimizer: Any, version: Any,
                   worker_steps: Any) -> Callable[[Any, Any], Any]:
    """The training step: reads ``version``, computes the gradient, pauses, applies it, counts the
    update; returns the loss, the version read, the update's number and timestamps.

    The pause of worker ``w`` comes from row ``w`` of ``pauses`` (microseconds), cycling over the
    steps that worker has run (counted in ``worker_steps`` on the parameter server)."""
    import tensorflow as tf

    loss_fn = keras2().losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    num_workers = int(worker_steps.shape[0])

    @tf.function
    def step(iterator: Any, pauses: Any) -> dict[str, Any]:
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        counts = worker_steps.assign_add(tf.one_hot(worker, num_workers, dtype=tf.int64))
        delay_us = pauses[worker, (counts[worker] - 1) % tf.shape(pauses, out_type=tf.int64)[1]]

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

    return step


def _pause_table(num_workers: int, straggler: int | None, pattern: list[float]) -> Any:
    """Microseconds each worker pauses in its successive steps (cycling): zero but the straggler's row."""
    import numpy as np
    import tensorflow as tf

    table = np.zeros((num_workers, len(pattern)), np.int64)
    if straggler is not None:
        table[straggler] = [int(d * 1e6) for d in pattern]
    return tf.constant(table)


@contextlib.contextmanager
def _weight_snapshots(model: Any, interval: float | None, start: float) -> Iterator[list[tuple[float, list[Any]]]]:
    """Copies the weights now and every ``interval`` seconds while the block runs (none if None)."""
    snapshots: list[tuple[float, list[Any]]] = []
    if interval is None:
        yield snapshots
        return
    stop = threading.Event()

    def snapshot_loop() -> None:
        while not stop.wait(interval):
            snapshots.append((time.perf_counter() - start, model.get_weights()))

    snapshots.append((0.0, model.get_weights()))
    watcher = threading.Thread(target=snapshot_loop, name="staleness-snapshots", daemon=True)
    watcher.start()
    try:
        yield snapshots
    finally:
        stop.set()
        watcher.join()


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
        staleness: k >= 0 SSP (0: lockstep), None ASP (see
            :func:`~tensorfleet.strategies.staleness.resolve_staleness`).
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
    integer("straggler", straggler, minimum=0, maximum=scheduler.num_workers - 1, optional=True)
    pattern = _delay_pattern(straggler_delay)
    number("snapshot_interval", snapshot_interval, above=0, optional=True)

    with strategy.scope():
        model = model_fn()
        optimizer = optimizer_fn()
        version = tf.Variable(0, dtype=tf.int64, trainable=False, name="update_count")
        worker_steps = tf.Variable(tf.zeros([scheduler.num_workers], tf.int64), trainable=False,
                                   name="worker_steps")
    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn))
    step = _measured_step(strategy, model, optimizer, version, worker_steps)
    pauses = _pause_table(scheduler.num_workers, straggler, pattern)

    start = time.perf_counter()
    with _weight_snapshots(model, snapshot_interval, start) as snapshots:
        records = scheduler.run(step, steps=steps, args=(iter(per_worker), pauses), progress=progress)
    wall = time.perf_counter() - start
    if snapshot_interval is not None:
        snapshots.append((wall, model.get_weights()))
    for record in records:
        record.start -= start
        record.end -= start
    return model, TrainingRun(policy=policy, records=records, wall_seconds=wall, snapshots=snapshots,
                              straggler=straggler)
