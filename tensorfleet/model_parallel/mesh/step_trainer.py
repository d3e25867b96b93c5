"""Keras' own ``fit`` loop around the training step of a backend that lowers a chain model itself.

The ``mtf`` backend (Mesh-TensorFlow's graph, lowered by ``PlacementMeshImpl``, run in a
``tf.compat.v1.Session``), the ``keras`` backend (tensor-parallel stand-ins over a device grid) and
the chain form of the ``dtensor`` backend each make one training step: SGD on the mean softmax
cross-entropy of integer labels, over a full batch. None of them loops: :class:`StepTrainer` is a
``tf.keras.Model`` whose ``train_step`` runs that step, so batches, epochs, callbacks, the
progress bar and ``History`` are Keras' ``Model.fit`` (its logs: the mean loss of the epoch so far).
When ``fit`` ends the trained weights are back in the user's Keras model, which ``evaluate`` and
``predict`` then run on one device (Keras' own, with the compiled loss and metrics).

A backend module offers ``prepare(mesh, model, dims, *, x_shape, learning_rate) -> MeshRun``;
:func:`prepare_steps` is the hook for a step made some other way (``Mesh.fit_mtf``).
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from typing import Any, Callable

import tensorflow as tf

from tensorfleet.compat.keras import keras2
from tensorfleet.model_parallel.mesh.training import MeshHistory, training_batches

__all__ = ["MeshRun", "StepTrainer"]


@dataclasses.dataclass
class MeshRun:
    """One prepared training run of a backend: ``step(x, y) -> loss`` on a full batch, and
    ``finish() -> dict`` that writes the trained weights back and returns what the backend records
    for :class:`~.training.MeshHistory` (``placement``, ``grid``, ``weights``)."""

    step: Callable[[Any, Any], float]
    finish: Callable[[], dict[str, Any]]


_keras2: Any = keras2()  # tf_keras (tf.keras before TF 2.16): a module mypy does not follow


class StepTrainer(_keras2.Model):
    """Trains ``model`` with ``mesh``'s backend, one backend step per batch of Keras' ``fit``.

    ``compile`` takes ``tf.keras.optimizers.SGD`` (no momentum) and a sparse categorical
    cross-entropy of logits: the step the backends make. ``fit`` takes arrays and ``batch_size``;
    a last batch smaller than it is dropped (Mesh-TF graphs have a fixed batch dimension).
    ``prepare`` (optional) makes the run instead of the backend module (``Mesh.fit_mtf``).
    """

    trains_on_mesh = True
    """Its own ``compile`` is Keras' (the scope's compile hook lets it through)."""
    weights_on_mesh = False
    """``fit`` writes the trained weights back into the Keras model, whose own ``get_weights`` reads them."""

    def __init__(self, mesh: Any, model: Any = None, *,
                 prepare: Callable[[int, tuple[int, ...]], MeshRun] | None = None) -> None:
        super().__init__(name=f"{getattr(model, 'name', 'mtf_model')}_on_mesh")
        self.mesh = mesh
        self.model = model
        self._prepare = prepare
        self.learning_rate = 0.0
        self.step_loss: list[float] = []
        self.step_seconds: list[float] = []
        self.record: dict[str, Any] = {}
        self._run: MeshRun | None = None
        self._last = 0.0
        self._loss_tracker = keras2().metrics.Mean(name="loss")

    def call(self, inputs: Any, training: Any = None) -> Any:
        return self.model(inputs, training=training)

    def compile(self, optimizer: Any = "sgd", loss: Any = None, metrics: Any = None, **kwargs: Any) -> None:
        optimizer = keras2().optimizers.get(optimizer)
        backend = self.mesh.backend.value
        if type(optimizer) is not keras2().optimizers.SGD or optimizer.get_config().get("momentum"):
            raise ValueError(f"The {backend} mesh backend trains with plain SGD (tf.keras.optimizers.SGD without "
                             "momentum); backend='dtensor' takes any Keras optimizer. Received: "
                             f"optimizer={optimizer!r}")
        loss_fn = keras2().losses.get(loss)
        if not (isinstance(loss_fn, keras2().losses.SparseCategoricalCrossentropy)
                and loss_fn.get_config().get("from_logits")):
            raise ValueError(f"The {backend} mesh backend trains on the softmax cross-entropy of logits: "
                             "loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True); backend='dtensor' "
                             f"takes any Keras loss. Received: loss={loss!r}")
        self.learning_rate = float(optimizer.get_config()["learning_rate"])
        super().compile(optimizer=optimizer, loss=loss_fn, metrics=metrics, run_eagerly=True, **kwargs)

    @property
    def metrics(self) -> list[Any]:
        compiled = getattr(self, "compiled_metrics", None)
        return [self._loss_tracker] + (compiled.metrics if compiled is not None and compiled.built else [])

    def test_step(self, data: Any) -> dict[str, Any]:
        # Keras' own evaluation of the user's model, whose weights fit wrote back
        x, y = data
        y_pred = self(x, training=False)
        self._loss_tracker.update_state(self.compiled_loss(y, y_pred, regularization_losses=self.model.losses))
        self.compiled_metrics.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def fit(self, x: Any = None, y: Any = None, batch_size: Any = None, epochs: int = 1, verbose: Any = "auto",
            callbacks: Any = None, shuffle: bool = True, **kwargs: Any) -> Any:
        batch_size = 32 if batch_size is None else batch_size
        x, y, _ = training_batches(x, y, epochs, batch_size, self.learning_rate or 1.0)
        if self.model is not None:
            self.mesh.check(self.model, batch_size)
        data = tf.data.Dataset.from_tensor_slices((x, y))
        if shuffle:
            data = data.shuffle(len(x), reshuffle_each_iteration=True)
        self._run = self._make_run(batch_size, tuple(x.shape[1:]))
        self._last = time.perf_counter()
        try:
            history = super().fit(data.batch(batch_size, drop_remainder=True), epochs=epochs, verbose=verbose,
                                  callbacks=callbacks, **kwargs)
        finally:
            self.record = self._run.finish()
            self._run = None
        return history

    def _make_run(self, batch_size: int, example_shape: tuple[int, ...]) -> MeshRun:
        x_shape = (batch_size, *example_shape)
        if self._prepare is not None:
            return self._prepare(batch_size, x_shape)
        backend = importlib.import_module(f"tensorfleet.model_parallel.mesh.{self.mesh.backend.value}")
        dims = self.mesh.check(self.model, batch_size)
        return backend.prepare(self.mesh, self.model, dims, x_shape=x_shape, learning_rate=self.learning_rate)

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y = data
        assert self._run is not None, "train_step runs inside fit, which makes the run"
        loss = float(self._run.step(x.numpy(), y.numpy()))
        now = time.perf_counter()
        self.step_loss.append(loss)
        self.step_seconds.append(now - self._last)
        self._last = now
        self._loss_tracker.update_state(loss)
        return {"loss": self._loss_tracker.result()}

    def mesh_history(self, epochs: int, first_step: int = 0) -> MeshHistory:
        """The :class:`~.training.MeshHistory` of the last ``epochs`` epochs, from step ``first_step`` on."""
        # Plain lists and dicts again: Keras wraps those set on a model to track them
        run = (list(self.step_loss[first_step:]), list(self.step_seconds[first_step:]))
        recorded = {key: [list(row) for row in value] if key == "grid" else dict(value)
                    for key, value in self.record.items()}
        return MeshHistory.from_steps(run, epochs=epochs, backend=self.mesh.backend.value, devices=self.mesh.devices,
                                      **recorded)
