"""A migratable job on the mesh's data-parallel layout: the trainer task's steps run by the mesh itself.

The placement ``mesh`` over ``devices`` local devices is a 1-D :class:`~tensorfleet.model_parallel.mesh.Mesh`
(``"b:N"``, the rule ``"batch:b"``, dtensor backend): every weight is a DTensor DVariable replicated
over the ``b`` devices, and each step's batch is split over them. The job's model is built and
compiled in ``mesh.scope()``, the one way into the mesh, and each step is the mesh's own training
function (``model.mesh_trainer.make_train_function()``: gradients, then the update) on the step's
examples, so nothing of the mesh's loop is redone here. The loss is the model's compiled one, its
mean over the step's examples: the same update as the other placements' sum over the step divided
by its size.

The checkpoint is the same as every placement's (:mod:`~tensorfleet.cluster.jobstate`): the model,
the mesh's optimizer (its slots and step count) and the example counts, saved without their
layout, so a job moves onto the mesh from mirrored, multi-worker mirrored or a parameter server,
and off it again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorfleet.cluster.resumable import MigratableJob, TaskOptions, Trainer

__all__ = ["MeshJobTrainer"]


class MeshJobTrainer(Trainer):
    """:class:`~tensorfleet.cluster.resumable.Trainer` of the ``mesh`` placement (one process)."""

    def _placement(self, options: TaskOptions) -> tuple[Any, Any]:
        import tensorfleet as tfl
        from tensorfleet.model_parallel.mesh import Mesh

        devices = tfl.strategies.simulate_devices(options.devices) if options.devices > 1 else None
        self.mesh = Mesh(f"b:{options.devices}", "batch:b", backend="dtensor", devices=devices)
        return None, None

    def _build(self, job: MigratableJob) -> tuple[Any, Any, Any]:
        import tensorflow as tf

        from tensorfleet.cluster.migration import Placement, check_mesh_batches

        check_mesh_batches(Placement("mesh", devices=self.options.devices), self.examples,
                           self._global_batch())
        with self.mesh.scope():
            model = job.build_model()  # compiled inside: the mesh's trainer takes it
        optimizer = model.optimizer
        with tf.name_scope(optimizer.name):  # its slots now, as its first update would name them
            optimizer.build(model.mesh_trainer.trainable_variables)
        self.train_function = model.mesh_trainer.make_train_function()
        counts = tf.Variable(tf.zeros([self.examples]), trainable=False, name="example_counts")
        return model, optimizer, counts

    def _global_batch(self) -> int:
        from tensorfleet.cluster.resumable import batch_for

        return batch_for(self.options, self.options.devices)

    def _per_example_loss(self) -> Any:
        return None  # the mesh's training function applies the model's compiled loss

    def _replicas(self) -> int:
        return self.options.devices

    def _is_chief(self) -> bool:
        return True

    def step(self, ids: np.ndarray) -> None:
        """Trains one step on the example ids ``ids`` with the mesh's training function."""
        self.train_function(iter([(self._on_mesh(self.x[ids]), self._on_mesh(self.y[ids]))]))
        self.counts.assign_add(np.bincount(ids, minlength=self.examples).astype(np.float32))
        self.steps_run += 1

    def _on_mesh(self, values: np.ndarray) -> Any:
        """A batch split over the mesh's ``b`` devices, as the mesh's ``fit`` feeds its training function."""
        from tensorflow.experimental import dtensor

        dmesh = self.mesh.dtensor_mesh
        whole = dtensor.copy_to_mesh(values, dtensor.Layout.replicated(dmesh, values.ndim))
        return dtensor.relayout(whole, dtensor.Layout.batch_sharded(dmesh, "b", values.ndim))

    def predict(self, x: np.ndarray) -> Any:
        return self.model.predict(x, batch_size=len(x))
