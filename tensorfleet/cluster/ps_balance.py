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
update the equal split makes in expectation.

The coordinator's own dispatch is kept: steps are scheduled one after another, with no wait between
them, and each worker takes the next as soon as it is free. A dequeue of more than the queue holds
would wait for ever, so each step is given a cap, and the caps of the steps not yet known to be done
never add up to more than the queue holds (a step takes the smaller of its worker's batch and its
cap); the coordinator learns what a step took by fetching its result, the oldest first, only when
the caps would otherwise run out. It waits for every step (joins) only where the epoch needs it:
at the epoch's end (the accuracy, and the next epoch's order), and where ``stop_at_step``,
``save_every`` or a stop signal saves, at exact step counts.

What the split by speed adds to that dispatch is not throughput: the coordinator already gives a
free worker the next step, so under the equal split a faster worker takes more steps and every
worker is busy; the job's rate is the sum of the workers' either way. It makes the steps equally
long, so a slow worker's gradient is computed on weights as few updates old as a fast one's, and a
slow worker's last step of an epoch holds the epoch's end back by one equal-length step, not by
one of its own slow ones.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np

from tensorfleet.cluster.balance import proportional_split, ps_workers, worker_wait
from tensorfleet.cluster.contract import BATCHES, EPOCH_ENDED_AT_STEP, FINISHED, FIRST_STEP_DONE
from tensorfleet.cluster.jobstate import JobProgress, epoch_order
from tensorfleet.cluster.resumable import MigratableJob, Trainer, save_progress, stopped_here

__all__ = ["BalancedServerTrainer", "train_dispatched"]

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
        self.pending: deque[tuple[Any, int]] = deque()  # steps scheduled, not yet known done, and their caps
        self.capped = 0  # the caps of those steps: never more than the queue holds
        self.queued = 0  # examples in the queue, as far as the finished steps tell
        self._capped_step = tf.function(lambda cap: self.strategy.run(self._worker_step, args=(cap,)))
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

    def record(self, worker: int, size: int, seconds: float) -> None:
        """Notes a finished step's examples and speed, and sets the batches by speed once every worker has one."""
        speed = size / max(seconds, 1e-6)
        seen = self.worker_speeds[worker] > 0
        self.worker_speeds[worker] = 0.5 * self.worker_speeds[worker] + 0.5 * speed if seen else speed
        self.worker_examples[worker] += size
        if self.options.balance and (self.worker_speeds > 0).all():
            sizes = proportional_split(self.workers * self.options.global_batch_size, self.worker_speeds.tolist())
            if sizes != self.sizes and (not self.sizes or max(abs(a - b) for a, b in zip(sizes, self.sizes)) > 1):
                BATCHES.say(who="worker", sizes=sizes, step=self.steps_run,
                            speeds=", ".join(f"{v:.0f}" for v in self.worker_speeds))
                self.batches.assign(sizes)
                self.sizes = sizes

    def schedule(self, cap: int) -> None:
        """Schedules one step of at most ``cap`` examples (no wait)."""
        import tensorflow as tf

        self.pending.append((self.coordinator.schedule(self._capped_step, args=(tf.constant(cap, tf.int32),)), cap))
        self.capped += cap
        self.steps_run += 1

    def settle_one(self) -> None:
        """Waits for the oldest step not yet known to be done, and notes what it took."""
        remote, cap = self.pending.popleft()
        worker, size, seconds = remote.fetch()
        self.capped -= cap
        self.queued -= int(size)
        self.record(int(worker), int(size), float(seconds))

    def barrier(self) -> None:
        super().barrier()
        while self.pending:
            self.settle_one()

    def train_loop(self, state: JobProgress) -> JobProgress:
        return train_dispatched(self, state)

    def fill(self, ids: np.ndarray) -> None:
        self.queue.enqueue_many([ids.astype(np.int32)])
        self.queued += len(ids)


def _end_epoch(trainer: BalancedServerTrainer, state: JobProgress, after: Any) -> tuple[JobProgress, Any]:
    """Says that the epoch ended, and queues the next epoch's examples (when there is one): the state of the
    next epoch, and the random state after its order."""
    options = trainer.options
    accuracy = trainer.accuracy()
    EPOCH_ENDED_AT_STEP.say(epoch=state.epoch + 1, epochs=options.epochs, step=state.step, at=time.time(),
                            details=("" if accuracy is None else f" accuracy {accuracy:.4f}")
                            + f"; examples per worker {trainer.worker_examples.tolist()}")
    state = replace(state, epoch=state.epoch + 1, position=0, rng=after)
    order, after = epoch_order(state.rng, state.examples)
    if state.epoch < options.epochs:
        trainer.fill(order)
    return state, after


def train_dispatched(trainer: BalancedServerTrainer, state: JobProgress) -> JobProgress:
    """:func:`~tensorfleet.cluster.resumable.train` for a balanced parameter server: the coordinator's
    dispatch, each step capped so that the steps in flight never ask the queue for more than it holds."""
    options = trainer.options
    order, after = epoch_order(state.rng, state.examples)
    trainer.fill(order[state.position:])
    first = True
    while state.epoch < options.epochs:
        if options.stop_at_step is not None and state.step >= options.stop_at_step or trainer.stop_agreed():
            trainer.barrier()
            state = replace(state, position=state.examples - trainer.queued)
            if stopped_here(trainer, state):
                return state
        room = trainer.queued - trainer.capped
        if room == 0 and trainer.pending:
            trainer.settle_one()
            continue
        if room > 0:
            trainer.schedule(min(room, int(max(trainer.sizes or [options.global_batch_size]))))
            state = replace(state, step=state.step + 1)
            if first:
                trainer.barrier()
                FIRST_STEP_DONE.say(at=time.time())
                first = False
        if trainer.queued == 0 or (room > 0 and options.save_every and state.step % options.save_every == 0):
            trainer.barrier()
            state = replace(state, position=state.examples - trainer.queued)
        if state.position == state.examples:
            state, after = _end_epoch(trainer, state, after)
        if room > 0 and options.save_every and state.step % options.save_every == 0:
            save_progress(trainer, state)
    save_progress(trainer, state)
    FINISHED.say(step=state.step, at=time.time())
    return state
