"""The task program of a migratable job: a Keras model trained step by step under any of
mirrored, multi-worker mirrored or parameter-server, from and to a migration checkpoint.

The job is a Python file that defines ``build_model()`` (a compiled Keras model, Keras 3 or
tf_keras: its optimizer and loss are the job's, and the job runs in the Keras the model is written
in) and ``data()`` (``(x, y)`` arrays). Every step trains on a
slice of the epoch's order of example ids, chosen by the step's position alone, so where the
job stopped and at what world size it continues does not change which examples it reads:

* mirrored and multi-worker mirrored: the step's ids are split over the replicas (in order of
  ``replica_id_in_sync_group``), each replica's loss is its examples' sum divided by the step's
  number of examples, so the all-reduced gradient is the mean over the step whatever the split;
* parameter server: the coordinator schedules each step, with its ids, on whichever worker is
  free (``ClusterCoordinator``), so a faster worker takes more steps; the variables live on the ps
  tasks. With ``balance`` the workers take batches by speed from a queue of the epoch's order instead
  (:mod:`~tensorfleet.cluster.ps_balance`); with ``equal_shares`` (a hook of :mod:`tensorfleet.testing`, for
  benchmarks) the steps go in rounds of one per worker, each round joined (every worker an equal share of
  the epoch: the slowest sets the pace);
* the mesh's data-parallel layout: :mod:`~tensorfleet.cluster.mesh_job`.

A SIGTERM or SIGINT (:class:`StopRequest`) stops the job at the next step boundary, saved, with
status 75; under multi-worker mirrored every step's all-reduce carries each worker's request, so
all stop after the same step.

Each step also adds its ids to a ``counts`` variable saved with the model, so the checkpoint
shows how many times every example was trained on. ``python -m tensorfleet.cluster.resumable
JOB.py [ARGS...]`` is what :func:`tensorfleet.cluster.migration.migrate` starts on every trainer task
(``ARGS``: the job file's ``sys.argv[1:]``); the options come in ``TENSORFLEET_MIGRATION``
(:class:`~tensorfleet.cluster.migration.TaskOptions`), and a task the launcher restarted after a failure
continues from the job's newest checkpoint. The lines it writes are those of
:mod:`~tensorfleet.cluster.contract`.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

# Sorted by hand: isort's one-name-a-line wrapping would take this module past the layout's 450 lines.
# isort: off
from tensorfleet.cluster.balance import SpeedMeter, proportional_split, ps_workers, python_wait, worker_wait
from tensorfleet.cluster.contract import (BATCHES, EPOCH_ENDED_AT_STEP, FINISHED, FIRST_STEP_DONE, RESUMED, SAVED,
                                         SAVING, STEP_DONE, STOPPED_STATUS, STOPPING, StopRequest, attempt, read_gate)
from tensorfleet.cluster.elastic import BatchPolicy
from tensorfleet.cluster.jobstate import (CheckpointError, JobProgress, check_same_keras, epoch_order, fingerprint,
                                          latest, new_rng_state, read_state, seed_job, tf_checkpoint_prefix,
                                          write_checkpoint)
from tensorfleet.cluster.migration import TaskOptions
from tensorfleet.compat.keras import is_keras3_model, keras_of, module_of
from tensorfleet.compat.keras3_checkpoints import seed_generators
from tensorfleet.compat.keras3_ps import make_updates_atomic
# isort: on

__all__ = ["MigratableJob", "StopRequest", "TaskOptions", "Trainer", "load_job", "main"]

@dataclass(frozen=True)
class MigratableJob:
    """A job file's two functions."""

    build_model: Any
    data: Any


def load_job(path: str | os.PathLike[str], args: Sequence[str] = ()) -> MigratableJob:
    """Reads a job file; it must define ``build_model()`` and ``data()``. While it runs, ``sys.argv`` is
    ``[path, *args]``, as for a script given those arguments."""
    saved, sys.argv = sys.argv, [str(path), *map(str, args)]
    try:
        names = runpy.run_path(str(path), run_name="__tensorfleet_job__")
    finally:
        sys.argv = saved
    missing = [n for n in ("build_model", "data") if not callable(names.get(n))]
    if missing:
        raise ValueError(f"A migratable job file defines build_model() (a compiled Keras model) and data() "
                         f"((x, y) arrays). {str(path)!r} lacks: {', '.join(missing)}.")
    return MigratableJob(names["build_model"], names["data"])


def _build_strategy(options: TaskOptions) -> tuple[Any, Any]:
    import tensorfleet as tfl

    if options.strategy == "mirrored":
        names = tfl.strategies.simulate_devices(options.devices) if options.devices > 1 else None
        return tfl.strategies.build("mirrored", devices=names), None
    if options.strategy == "multi_worker_mirrored":
        return tfl.strategies.build("multi_worker_mirrored", implementation="ring", timeout_seconds=120), None
    import tensorflow as tf

    strategy = tfl.strategies.build("parameter_server")
    return strategy, tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)


def _per_example_loss(loss: Any, keras: Any) -> Any:
    """The compiled ``loss`` (of the Keras module ``keras``, the model's) per example: unreduced."""
    if isinstance(loss, keras.losses.Loss):
        return type(loss).from_config({**loss.get_config(), "reduction": "none"})
    return keras.losses.get(loss)


class Trainer:
    """The model, its optimizer and the example counts under one strategy, and the step that trains them."""

    def __init__(self, job: MigratableJob, options: TaskOptions) -> None:
        import tensorflow as tf

        self.options = options
        self.strategy, self.coordinator = self._placement(options)  # first: logical devices precede the runtime
        tf.config.experimental.enable_op_determinism()
        seed_job(options.seed)
        x, y = job.data()
        self.x, self.y = np.asarray(x), np.asarray(y)
        self.examples = len(self.x)
        self.model, self.optimizer, self.counts = self._build(job)
        self.base_lr = self.optimizer.get_config().get("learning_rate")  # the job's, before a checkpoint restores
        self.loss = self._per_example_loss()
        # A Keras 3 model's seed generators (Dropout's masks) are no part of its own TensorFlow checkpoint.
        self.seeds = [g.state for g in seed_generators(self.model)] if is_keras3_model(self.model) else []
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, counts=self.counts,
                                              **({"seeds": self.seeds} if self.seeds else {}))
        self.replicas = self._replicas()
        self.chief = self._is_chief()
        self.measure = self.coordinator is None  # a parameter server's workers run no Python
        slowed = self.replicas if self.coordinator is None else ps_workers()  # a parameter server's: per worker
        factors = list(options.slowdown or [1.0] * slowed) + [1.0] * slowed
        self.delays = tf.constant([options.input_delay * f for f in factors[:slowed]], tf.float64)
        self.meter = SpeedMeter(self.replicas)
        self.stop = StopRequest()
        self.peers_stop = False  # what the last step's all-reduce said of every task's stop request
        self.steps_run = 0
        self.sizes: list[int] = []
        self.worker_examples = np.zeros(slowed, dtype=np.int64)  # a parameter server's: who read the epoch
        self._reports: list[Any] = []
        self._step = tf.function(self._distributed_step, reduce_retracing=True)  # batches change shape

    def _placement(self, options: TaskOptions) -> tuple[Any, Any]:
        return _build_strategy(options)

    def _build(self, job: MigratableJob) -> tuple[Any, Any, Any]:
        """The job's model and optimizer (its slots built, so that a checkpoint restores into them) and the counts."""
        import tensorflow as tf

        with self.strategy.scope():
            model = job.build_model()
            optimizer = model.optimizer
            optimizer.build(model.trainable_variables)
            if self.coordinator is not None and is_keras3_model(model):  # steps at once on several workers
                make_updates_atomic(model)
            counts = tf.Variable(tf.zeros([self.examples]), trainable=False, name="example_counts",
                                 aggregation=tf.VariableAggregation.SUM)
        return model, optimizer, counts

    def _per_example_loss(self) -> Any:
        return _per_example_loss(self.model.loss, module_of(self.model, "a migratable job's build_model()"))

    def _replicas(self) -> int:
        return 1 if self.coordinator is not None else self.strategy.num_replicas_in_sync

    def _is_chief(self) -> bool:
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if self.coordinator is not None or resolver is None or not resolver.task_type:
            return True
        return resolver.task_type == "chief" or (resolver.task_type == "worker" and resolver.task_id == 0)

    @property
    def collective(self) -> bool:
        """Whether the replicas are processes of their own (multi-worker mirrored), whose stop must be agreed."""
        return self.options.strategy == "multi_worker_mirrored"

    def stop_agreed(self) -> bool:
        """Whether the job stops at this step boundary: a stop request of this process, or, with processes
        that step together, of any of them as the last step's all-reduce carried it (so all stop at once)."""
        return self.peers_stop if self.collective else self.stop.requested

    def _replica_step(self, ids: Any, total: Any, stop: Any) -> Any:
        import tensorflow as tf

        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        examples = tf.cast(tf.size(ids), tf.float64)
        if self.coordinator is not None:
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            if self.options.input_delay:  # a worker runs no Python: tf.data waits
                ids = worker_wait(ids, examples * 1e6 * tf.gather(self.delays, worker))
        if self.measure:
            began = tf.py_function(time.perf_counter, [], tf.float64)
            # A slowed input pipeline (benchmarks and tests of heterogeneous workers): a wait per example.
            waited = tf.py_function(python_wait, [examples * tf.gather(self.delays, replica)], tf.float64)
            with tf.control_dependencies([began, waited]):
                ids = tf.identity(ids)
        x, y = tf.gather(self.x, ids), tf.gather(self.y, ids)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(self.loss(y, self.model(x, training=True))) / total
        grads = tape.gradient(loss, self.model.trainable_variables)
        speed = tf.zeros([self.replicas], tf.float64)
        if self.measure:  # this replica's own time, before the all-reduce in apply_gradients
            with tf.control_dependencies(grads):
                ended = tf.py_function(time.perf_counter, [], tf.float64)
            speed = tf.one_hot(replica, self.replicas, dtype=tf.float64) * examples / tf.maximum(ended - began, 1e-6)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        self.counts.assign_add(tf.math.bincount(ids, minlength=self.examples, maxlength=self.examples,
                                                dtype=tf.float32))
        if self.coordinator is not None:  # which worker ran the step, and on how many examples
            return tf.stack([tf.cast(worker, tf.float64), examples])
        # The speeds and every task's stop request travel in one small all-reduce.
        return tf.concat([speed, tf.reshape(stop, [1])], axis=0)

    def _distributed_step(self, ids: Any, total: Any, stop: Any) -> Any:
        import tensorflow as tf

        reported = self.strategy.run(self._replica_step, args=(ids, total, stop))
        if self.coordinator is not None:
            return reported
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, reported, axis=None)

    def split(self, examples: int) -> list[int]:
        """Examples per replica: in proportion to the measured speeds with ``balance``, else equal."""
        if self.options.balance and self.meter.ready:
            return proportional_split(examples, self.meter.speeds.tolist())
        return [len(part) for part in np.array_split(np.arange(examples), self.replicas)]

    def step(self, ids: np.ndarray) -> None:
        """Trains one step on the example ids ``ids`` (split over the replicas in order)."""
        import tensorflow as tf

        total = tf.constant(float(len(ids)))
        stop = tf.constant(1.0 if self.stop.requested else 0.0, tf.float64)
        if self.coordinator is not None:
            self._reports.append(self.coordinator.schedule(self._step, args=(tf.constant(ids, tf.int32), total, stop)))
            self.steps_run += 1
            if self.options.equal_shares and len(self._reports) == len(self.worker_examples):
                self.barrier()  # a round of one step per worker: the next starts when the slowest is done
            return
        parts = np.split(ids.astype(np.int32), np.cumsum(self.split(len(ids)))[:-1])
        dist = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group]))
        reported = self._step(dist, total, stop).numpy()
        speeds, self.peers_stop = reported[:-1], bool(reported[-1] > 0)
        self.steps_run += 1
        if self.steps_run > 1:  # the first step also traced the function
            self.meter.update(speeds)
        sizes = [len(part) for part in parts]
        if self.options.balance and self.chief and self.meter.ready and sizes != self.sizes:
            BATCHES.say(who="replica", sizes=sizes, step=self.steps_run,
                        speeds=", ".join(f"{v:.0f}" for v in self.meter.speeds))
        self.sizes = sizes

    def accuracy(self) -> float | None:
        """The share of the job's examples the model classifies right (None: not a classifier), after every
        step scheduled so far has run."""
        if not np.issubdtype(self.y.dtype, np.integer):
            return None
        self.barrier()
        logits = np.asarray(self.predict(self.x))
        if logits.ndim != 2 or logits.shape[1] < 2:
            return None
        return float(np.mean(np.argmax(logits, axis=1) == self.y.reshape(-1)))

    def predict(self, x: np.ndarray) -> Any:
        return self.model(x, training=False).numpy()

    def barrier(self) -> None:
        if self.coordinator is not None:
            self.coordinator.join()
            for worker, examples in (r.fetch() for r in self._reports):
                self.worker_examples[int(worker)] += int(examples)
            self._reports = []

    def restore(self, path: Path) -> None:
        import tensorflow as tf

        prefix = tf_checkpoint_prefix(path)
        tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, counts=self.counts).read(
            prefix).assert_existing_objects_matched()
        if self.seeds:  # absent from a checkpoint written before they were saved: then they start afresh
            tf.train.Checkpoint(seeds=self.seeds).read(prefix).expect_partial()


def batch_for(options: TaskOptions, replicas: int) -> int:
    """The global batch of a step at ``replicas`` under the job's policy."""
    from tensorfleet.cluster.elastic import batch_sizes

    return batch_sizes(replicas, policy=options.policy, global_batch_size=options.global_batch_size,
                       per_replica_batch_size=options.per_replica_batch_size).global_batch_size


def _initial_state(trainer: Trainer, options: TaskOptions) -> JobProgress:
    digest = fingerprint(trainer.model)
    if options.resume:
        state, path = read_state(options.out_dir)
        check_same_keras(state, trainer.model, options.out_dir)
        if state.fingerprint != digest:
            raise CheckpointError(f"The checkpoint in {options.out_dir!r} is of another model (fingerprint "
                                  f"{state.fingerprint}, this job's model {digest}).")
        trainer.restore(path)
        RESUMED.say(step=state.step, epoch=state.epoch + 1, position=state.position, examples=state.examples,
                    strategy=state.strategy, replicas=state.replicas,
                    iterations=int(trainer.optimizer.iterations.numpy()))
        return state
    parameters = int(sum(np.prod(w.shape) for w in trainer.model.weights))
    return JobProgress(step=0, epoch=0, epochs=options.epochs, position=0, seed=options.seed,
                       rng=new_rng_state(options.seed),
                    examples=trainer.examples, global_batch_size=batch_for(options, trainer.replicas),
                    policy=BatchPolicy(options.policy).value, fingerprint=digest, parameters=parameters,
                    strategy=options.strategy, replicas=trainer.replicas,
                    keras=keras_of(trainer.model, "a migratable job's build_model()").value)


def save_progress(trainer: Trainer, state: JobProgress) -> None:
    trainer.barrier()
    if trainer.chief:
        SAVING.say(step=state.step)
    write_checkpoint(trainer.options.out_dir, state, trainer.checkpoint, chief=trainer.chief)
    if trainer.chief:
        SAVED.say(step=state.step)


def _scale_learning_rate(trainer: Trainer, batch: int) -> None:
    """``--scale-lr``: the job's compiled learning rate, scaled to this placement's global batch."""
    if not trainer.options.scale_lr:
        return
    from tensorfleet.strategies.large_batch import check_settable, parse_scale_lr, scaled_lr

    check_settable(trainer.optimizer)
    rule, reference = parse_scale_lr(trainer.options.scale_lr)
    trainer.optimizer.learning_rate = scaled_lr(trainer.base_lr, global_batch=batch, reference_batch=reference,
                                                rule=rule)


def train(trainer: Trainer, state: JobProgress) -> JobProgress:
    """Trains from ``state`` to the end of the job, to ``stop_at_step``, or to the step boundary where a
    SIGTERM or SIGINT stops it (:class:`StopRequest`); returns the last state, saved."""
    options = trainer.options
    batch = batch_for(options, trainer.replicas)
    _scale_learning_rate(trainer, batch)
    state = replace(state, strategy=options.strategy, replicas=trainer.replicas, global_batch_size=batch,
                    epochs=options.epochs,
                    history=[*state.history, {"step": state.step, "strategy": options.strategy,
                                              "replicas": trainer.replicas, "global_batch_size": batch}])
    if hasattr(trainer, "train_loop"):  # a parameter server whose workers take batches by speed (ps_balance)
        return trainer.train_loop(state)
    order, after = epoch_order(state.rng, state.examples)
    first, begin = True, state.step
    while state.epoch < options.epochs:
        if stopped_here(trainer, state):
            return state
        if options.gate:
            _await_turn(options.gate, state.step - begin, trainer.stop)
            if trainer.stop_agreed():
                continue  # stopped while waiting for its turn: saved at the top of the loop
        trainer.step(order[state.position:state.position + batch])
        if options.gate:
            trainer.barrier()
            STEP_DONE.say(step=state.step + 1, at=time.time())
        if first:
            trainer.barrier()
            FIRST_STEP_DONE.say(at=time.time())
            first = False
        position = min(state.position + batch, state.examples)
        state = replace(state, step=state.step + 1, position=position)
        if position == state.examples:
            accuracy = trainer.accuracy()
            EPOCH_ENDED_AT_STEP.say(epoch=state.epoch + 1, epochs=options.epochs, step=state.step, at=time.time(),
                                    details=("" if accuracy is None else f" accuracy {accuracy:.4f}")
                                    + _per_worker(trainer))
            state = replace(state, epoch=state.epoch + 1, position=0, rng=after)
            order, after = epoch_order(state.rng, state.examples)
        if options.save_every and state.step % options.save_every == 0:
            save_progress(trainer, state)
    save_progress(trainer, state)
    FINISHED.say(step=state.step, at=time.time())
    return state


def _per_worker(trainer: Trainer) -> str:
    """A parameter server's examples read by each worker so far (after a barrier), for the epoch's log line."""
    if trainer.coordinator is None:
        return ""
    trainer.barrier()
    return f"; examples per worker {trainer.worker_examples.tolist()}"


def stopped_here(trainer: Trainer, state: JobProgress) -> bool:
    """Whether the job stops at this step boundary (``stop_at_step``, or a stop signal, agreed); if so, saved."""
    if trainer.options.stop_at_step is not None and state.step >= trainer.options.stop_at_step:
        reason = "as planned"
    elif trainer.stop_agreed():
        reason = (f"to move (received {signal.Signals(trainer.stop.signal).name})" if trainer.stop.signal is not None
                  else "to move (another task received a stop signal)")
    else:
        return False
    save_progress(trainer, state)
    STOPPING.say(step=state.step, reason=reason, at=time.time())
    return True


def _await_turn(gate: str, step: int, stop: StopRequest) -> None:
    """Waits at a step boundary until the scheduler of shared devices allows this run's step ``step + 1``,
    or a stop is requested (then the next step carries the request to the other tasks).

    The gate file holds how many steps this run may have done (see :mod:`~tensorfleet.cluster.multiplex`).
    """
    while not stop.requested:
        if read_gate(gate) > step:
            return
        time.sleep(0.005)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.exit("usage: python -m tensorfleet.cluster.resumable JOB.py [ARGS...]  (options in $TENSORFLEET_MIGRATION)")
    options = TaskOptions.from_env()
    if not options.resume and attempt() > 0 and latest(options.out_dir) is not None:
        options = replace(options, resume=True)  # restarted after a failure: from the last checkpoint
    job = load_job(argv[0], argv[1:])
    sys.argv = [argv[0], *argv[1:]]  # the job's functions see its arguments, as its file did
    trainer = _trainer(job, options)
    trainer.stop.install()  # after the strategy: TensorFlow's multi-worker runtime installs a SIGTERM handler
    state = train(trainer, _initial_state(trainer, options))
    sys.stdout.flush()
    stopped = state.epoch < options.epochs  # at stop_at_step, or on a signal: ready to move
    os._exit(STOPPED_STATUS if stopped else 0)  # a parameter-server coordinator would keep the interpreter alive


def _trainer(job: MigratableJob, options: TaskOptions) -> Trainer:
    """The trainer of ``options.strategy`` (the mesh's lives in :mod:`~tensorfleet.cluster.mesh_job`)."""
    if options.strategy == "mesh":
        from tensorfleet.cluster.mesh_job import MeshJobTrainer

        return MeshJobTrainer(job, options)
    if options.strategy == "parameter_server" and options.balance:
        from tensorfleet.cluster.ps_balance import BalancedServerTrainer

        return BalancedServerTrainer(job, options)
    return Trainer(job, options)


if __name__ == "__main__":  # pragma: no cover - the task the launcher starts
    main()
