"""Heterogeneous workers under a parameter server: per-worker batches in proportion to measured speed.

``ClusterCoordinator.schedule`` runs a step on whichever worker is free and offers no way to name
the worker, and ``PerWorkerValues`` holds only values TensorFlow made on the workers ("The
mechanism to create a custom PerWorkerValues is not yet supported"), so the coordinator cannot hand
each worker example ids of its own. The worker takes them instead: the epoch's order of example ids
(from the step's position on, as the migration checkpoint records it) waits in a queue on the first
ps task, and each step, wherever it runs, reads its worker's index
(``tf.distribute.coordinator.experimental_get_current_worker_index``) and dequeues that worker's
batch size from a table of them on the ps (``dequeue_many`` is atomic, so the steps together read
the order's prefix, each example once). The step times its own compute on its worker
(``tf.timestamp`` before the dequeue and after the gradients) and returns its worker, its examples
and its seconds; the coordinator sets the next batch sizes in proportion to the measured speeds
(:func:`~tensorfleet.cluster.balance.proportional_split` of ``workers x global_batch_size``; the
equal split gives every worker ``global_batch_size``, as an unbalanced parameter-server step has).

The gradient is weighted by examples: each step's loss is its examples' sum divided by the global
batch size, so every example moves the weights by the same amount whichever worker read it, the
update the equal split makes in expectation. Steps are scheduled in waves that can never ask the
queue for more than it holds (a dequeue of more would wait for ever); between waves the coordinator
joins, reads the speeds and decides where to stop or save, so ``stop_at_step``, ``save_every`` and a
stop signal act at exact step counts.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from tensorfleet.cluster.balance import proportional_split, ps_workers, worker_wait
from tensorfleet.cluster.jobstate import JobProgress, epoch_order
from tensorfleet.cluster.resumable import MigratableJob, Trainer, save_progress, say, stopped_here

__all__ = ["BalancedServerTrainer", "train_waves"]

_WAVE_STEPS_PER_WORKER = 4


class BalancedServerTrainer(Trainer):
    """:class:`~tensorfleet.cluster.resumable.Trainer` of a parameter server whose workers take batches by speed."""

    def _build(self, job: MigratableJob) -> tuple[Any, Any, Any]:
        import tensorflow as tf

        built = super()._build(job)
        self.workers = ps_workers()
        with self.strategy.scope():
            self.batches = tf.Variable([self.options.global_batch_size] * self.workers, dtype=tf.int32,
                                       trainable=False, name="worker_batches")
        with tf.device("/job:ps/replica:0/task:0"):
            self.queue = tf.queue.FIFOQueue(self.examples, [tf.int32], shapes=[[]], name="epoch_order")
        self.worker_speeds = np.zeros(self.workers)
        self.worker_examples = np.zeros(self.workers, dtype=np.int64)
        self._wave_step = tf.function(lambda cap: self.strategy.run(self._worker_step, args=(cap,)))
        return built

    def _worker_step(self, cap: Any) -> Any:
        import tensorflow as tf

        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        began = tf.timestamp()
        size = tf.minimum(tf.gather(self.batches, worker), cap)
        ids = self.queue.dequeue_many(size)
        ids = worker_wait(ids, tf.cast(size, tf.float64) * 1e6 * tf.gather(self.delays, worker))
        x, y = tf.gather(self.x, ids), tf.gather(self.y, ids)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(self.loss(y, self.model(x, training=True))) / float(self.options.global_batch_size)
        grads = tape.gradient(loss, self.model.trainable_variables)
        with tf.control_dependencies(grads):
            seconds = tf.timestamp() - began
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        self.counts.assign_add(tf.math.bincount(ids, minlength=self.examples, maxlength=self.examples,
                                                dtype=tf.float32))
        return tf.stack([tf.cast(worker, tf.float64), tf.cast(size, tf.float64), seconds])

    def wave(self, steps: int, cap: int) -> None:
        """Runs ``steps`` steps, each of at most ``cap`` examples, and waits for them; records the speeds."""
        import tensorflow as tf

        results = [self.coordinator.schedule(self._wave_step, args=(tf.constant(cap, tf.int32),))
                   for _ in range(steps)]
        self.coordinator.join()
        for worker, size, seconds in (r.fetch() for r in results):
            w = int(worker)
            speed = size / max(seconds, 1e-6)
            seen = self.worker_speeds[w] > 0
            self.worker_speeds[w] = 0.5 * self.worker_speeds[w] + 0.5 * speed if seen else speed
            self.worker_examples[w] += int(size)
        self.steps_run += steps
        if self.options.balance and (self.worker_speeds > 0).all():
            sizes = proportional_split(self.workers * self.options.global_batch_size, self.worker_speeds.tolist())
            if sizes != self.sizes:
                say(f"worker batches {sizes} at step {self.steps_run} (examples/s measured: "
                     f"{', '.join(f'{v:.0f}' for v in self.worker_speeds)})")
                self.batches.assign(sizes)
                self.sizes = sizes

    def train_loop(self, state: JobProgress) -> JobProgress:
        return train_waves(self, state)

    def fill(self, ids: np.ndarray) -> None:
        self.queue.enqueue_many([ids.astype(np.int32)])

    def remaining(self) -> int:
        return int(self.queue.size().numpy())


def _wave_size(trainer: BalancedServerTrainer, state: JobProgress, remaining: int) -> tuple[int, int]:
    """How many steps the next wave runs and the most examples each may take: never more than the queue
    holds, and never past ``stop_at_step`` or the next ``save_every``."""
    largest = int(max(trainer.sizes or [trainer.options.global_batch_size]))
    steps, cap = (remaining // largest, largest) if remaining >= largest else (1, remaining)
    options = trainer.options
    steps = min(steps, _WAVE_STEPS_PER_WORKER * trainer.workers)  # speeds measured, batches set, every wave
    if options.stop_at_step is not None:
        steps = min(steps, options.stop_at_step - state.step)
    if options.save_every:
        steps = min(steps, options.save_every - state.step % options.save_every)
    return max(steps, 1), cap


def train_waves(trainer: BalancedServerTrainer, state: JobProgress) -> JobProgress:
    """:func:`~tensorfleet.cluster.resumable.train` for a balanced parameter server: waves of steps."""
    options = trainer.options
    order, after = epoch_order(state.rng, state.examples)
    trainer.fill(order[state.position:])
    first = True
    while state.epoch < options.epochs:
        if stopped_here(trainer, state):
            return state
        steps, cap = _wave_size(trainer, state, state.examples - state.position)
        trainer.wave(steps, cap)
        if first:
            say(f"first step done at {time.time():.3f}")
            first = False
        state = replace(state, step=state.step + steps, position=state.examples - trainer.remaining())
        if state.position == state.examples:
            accuracy = trainer.accuracy()
            say(f"epoch {state.epoch + 1}/{options.epochs} end at step {state.step} at {time.time():.3f}"
                + ("" if accuracy is None else f" accuracy {accuracy:.4f}")
                + f"; examples per worker {trainer.worker_examples.tolist()}")
            state = replace(state, epoch=state.epoch + 1, position=0, rng=after)
            order, after = epoch_order(state.rng, state.examples)
            if state.epoch < options.epochs:
                trainer.fill(order)
        if options.save_every and state.step % options.save_every == 0:
            save_progress(trainer, state)
    save_progress(trainer, state)
    say(f"finished at step {state.step} at {time.time():.3f}")
    return state
