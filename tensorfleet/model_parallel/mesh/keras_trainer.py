"""The Keras model that trains a user's model on a DTensor mesh: :class:`MeshTrainer`, what ``fit`` and
the rest of a model compiled inside ``Mesh.scope()`` run (:class:`~.keras_model.OnMesh`).

Keras' own ``compile`` / ``fit`` / ``evaluate`` / ``predict`` loops, callbacks and progress bar, with
what TF 2.14's DTensor lacks supplied underneath (the design is in :mod:`.keras_layout`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.experimental import dtensor

from tensorfleet.compat.keras import keras2, require_keras2
from tensorfleet.compat.tf_keras import loss_function_wrapper, unfuse_normalization
from tensorfleet.model_parallel.mesh.keras_data import batch_layout, held_out, mesh_dataset, validation_pair
from tensorfleet.model_parallel.mesh.keras_layers import adapt_split_readers
from tensorfleet.model_parallel.mesh.keras_layout import KerasLayout
from tensorfleet.model_parallel.mesh.keras_model import clip_gradients, host_value, mesh_scope, with_mesh
from tensorfleet.model_parallel.mesh.zero import gathering, shard_optimizer_state, zero_layout
from tensorfleet.validation import positive_int

__all__ = ["AVG_POOL_GRADIENT", "MeshTrainer", "avg_pool_gradient"]

AVG_POOL_GRADIENT = "TensorfleetMeshAvgPool"
"""The registered name of :func:`avg_pool_gradient`."""


@tf.RegisterGradient(AVG_POOL_GRADIENT)
def avg_pool_gradient(op: Any, grad: Any) -> Any:
    """AvgPool's gradient for non-overlapping windows (``strides == ksize``, VALID padding, NHWC:
    what AveragePooling1D/2D do by default) as each output gradient spread evenly over its window,
    ops DTensor lays out; TF 2.14's DTensor has no layout propagation for ``AvgPoolGrad``. Other
    pools keep TensorFlow's own gradient."""
    ksize, strides = list(op.get_attr("ksize")), list(op.get_attr("strides"))
    x = op.inputs[0]
    if (op.get_attr("padding") != b"VALID" or op.get_attr("data_format") != b"NHWC" or ksize != strides
            or ksize[0] != 1 or ksize[3] != 1 or not x.shape.is_fully_defined()):
        return tf.raw_ops.AvgPoolGrad(orig_input_shape=tf.shape(x), grad=grad, ksize=ksize, strides=strides,
                                      padding=op.get_attr("padding"), data_format=op.get_attr("data_format"))
    spread = tf.repeat(tf.repeat(grad, ksize[1], axis=1), ksize[2], axis=2) / float(ksize[1] * ksize[2])
    rest_h, rest_w = x.shape[1] - spread.shape[1], x.shape[2] - spread.shape[2]
    if rest_h or rest_w:  # rows and columns VALID pooling dropped get no gradient
        spread = tf.pad(spread, [[0, 0], [0, rest_h], [0, rest_w], [0, 0]])
    return spread


_keras2: Any = keras2()  # tf_keras (tf.keras before TF 2.16): a module mypy does not follow


class MeshTrainer(_keras2.Model):
    """Trains ``model`` (built in ``Mesh.scope()``) with its weights laid out on a DTensor mesh.

    ``fit`` and ``evaluate`` take arrays (``x``, ``y``, ``batch_size``; full batches only, the batch
    split over the ``batch`` rule's mesh dimension) or a ``dtensor.DTensorDataset`` with
    ``steps_per_epoch``; ``fit`` validates on ``validation_data`` or the last ``validation_split``
    of the arrays after each epoch, as Keras does. Each training step runs two functions: the
    gradients (with Keras' clipping, laid out as the update reads them; ZeRO stages 2 and 3 split
    them over the batch axis, :mod:`.zero`), then the update and the metrics. ``get_weights()`` gathers the shards to
    the host; ``trainer.model`` is the user's model, whose weights the trainer trains.
    """

    trains_on_mesh = True
    """Its own ``compile`` is Keras' (the scope's compile hook lets it through)."""
    train_function: Any  # Keras' attributes, which make_train_function and make_test_function set
    test_function: Any
    weights_on_mesh = True
    """The weights stay DVariables on the mesh: ``get_weights`` gathers them."""

    def __init__(self, model: Any, layout: KerasLayout, dmesh: Any, *, zero: int = 0) -> None:
        require_keras2(model, "model.compile inside Mesh.scope()")
        with mesh_scope(layout, dmesh):
            super().__init__(name=f"{model.name}_on_mesh")
        self.model = model
        self.layout = layout
        self.dmesh = dmesh
        self.zero = zero
        for layer in model.submodules:  # no layout propagation for FusedBatchNormV3: same maths unfused
            unfuse_normalization(layer)
        self.adapted: list[str] = adapt_split_readers(model, layout.decided, layout.batch_axis, dmesh)
        """The pooling and Concatenate layers that read a tensor split along a non-batch axis, given a
        call that gathers it to be split along the batch alone (:func:`.keras_layers.adapt_split_readers`)."""
        self._loss_fn: Any = None  # Keras objects (a loss, a Mean metric) once compiled
        self._loss_tracker: Any = None

    def call(self, inputs: Any, training: Any = None) -> Any:
        return self.model(inputs, training=training)

    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, metrics: Any = None, **kwargs: Any) -> None:
        with mesh_scope(self.layout, self.dmesh):
            optimizer = with_mesh(optimizer, self.dmesh)
            super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)
            if self.zero:
                with tf.name_scope(self.optimizer.name):  # as apply_gradients builds it: "Adam/m/<weight>"
                    self.optimizer.build(self.trainable_variables)
                shard_optimizer_state(self.optimizer, self.layout.batch_axis)
            loss_fn = keras2().losses.get(loss)
            self._loss_fn = loss_fn if isinstance(loss_fn, keras2().losses.Loss) else loss_function_wrapper(loss_fn)
            self._loss_tracker = keras2().metrics.Mean(name="loss", mesh=self.dmesh)

    @property
    def metrics(self) -> list[Any]:
        compiled = getattr(self, "compiled_metrics", None)
        extra = compiled.metrics if compiled is not None and compiled.built else []
        return ([self._loss_tracker] if getattr(self, "_loss_tracker", None) is not None else []) + extra

    def _replicated(self, value: Any) -> Any:
        return dtensor.relayout(value, dtensor.Layout.replicated(self.dmesh, rank=value.shape.rank))

    def _loss(self, y: Any, y_pred: Any) -> Any:
        loss = self._loss_fn(y, y_pred)
        return loss + tf.add_n(self.model.losses) if self.model.losses else loss

    def _metrics_update(self, y: Any, y_pred: Any, loss: Any) -> dict[str, Any]:
        self._loss_tracker.update_state(self._replicated(loss))
        self.compiled_metrics.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def _gradient_layouts(self) -> list[Any]:
        """Where each gradient lives between the two functions of a step: its variable's layout, or
        from ZeRO stage 2 on, its optimizer slot's (split over the batch axis too)."""
        if self.zero < 2:
            return [v.layout for v in self.trainable_variables]
        return [zero_layout(v.layout, v.shape, self.layout.batch_axis) for v in self.trainable_variables]

    def make_train_function(self, force: bool = False) -> Any:
        if self.train_function is not None and not force:
            return self.train_function
        variables = self.trainable_variables
        layouts = self._gradient_layouts()

        @tf.function
        def gradients(x: Any, y: Any) -> Any:
            # tf.gradients, not a tape, so that the graph's gradient override gives AvgPool a gradient
            # DTensor can lay out (see avg_pool_gradient).
            override = tf.compat.v1.get_default_graph().gradient_override_map({"AvgPool": AVG_POOL_GRADIENT})
            with override, gathering() as gathered:
                y_pred = self.model(x, training=True)
                loss = self._loss(y, y_pred)
            # ZeRO 3: with respect to each weight as gathered for the forward pass (see .zero).
            grads = tf.gradients(loss, [gathered.get(id(v), v) for v in variables])
            # Clipping here, not in the update: computed there, it changed the result (TF 2.14).
            grads = clip_gradients(grads, self.optimizer.mesh_clipping)
            # Laid out as the update reads them (ZeRO 2 and 3: split over the batch axis, each replica keeps its
            # part), after their own layout: asked for the split layout at once, DTensor split the backward
            # matmuls in ways it cannot expand ("Contracting dimension for matmul has sharding dimension m for
            # the left input and b for the right input").
            grads = [g if g is None else dtensor.relayout(g, getattr(v, "compute_layout", v.layout))
                     for g, v in zip(grads, variables)]
            return y_pred, loss, [g if g is None else dtensor.relayout(g, layout) for g, layout in zip(grads, layouts)]

        @tf.function
        def update(y: Any, y_pred: Any, loss: Any, grads: Any) -> Any:
            # A separate function that only relays out and applies: in TF 2.14 DTensor, reading an
            # optimizer slot after its update in the function that also computed the gradients (or
            # clipped them) sometimes saw the old value.
            pairs = [(dtensor.relayout(g, layout), v) for g, layout, v in zip(grads, layouts, variables)
                     if g is not None]
            self.optimizer.apply_gradients(pairs)
            return self._metrics_update(y, y_pred, loss)

        def train_function(iterator: Any) -> Any:
            x, y = next(iterator)
            return update(y, *gradients(x, y))

        self._step_gradients = gradients
        self.train_function = train_function
        return train_function

    def step_gradients(self, x: Any, y: Any) -> list[Any]:
        """The gradients of one training step on the global batch ``x, y``, laid out as the step
        keeps them for its update (from ZeRO stage 2 on, split over the batch axis): to measure
        what each device holds (``dtensor.unpack``). Updates nothing."""
        self.make_train_function()
        return self._step_gradients(self._on_mesh(x), self._on_mesh(y))[2]

    def _on_mesh(self, values: Any) -> Any:
        import numpy as np

        values = np.asarray(values)
        whole = dtensor.copy_to_mesh(values, dtensor.Layout.replicated(self.dmesh, values.ndim))
        return dtensor.relayout(whole, self._batch_layout(values.ndim)) if self.layout.batch_axis else whole

    def _batch_layout(self, rank: int) -> Any:
        return batch_layout(self.layout, self.dmesh, rank)

    def _infer(self, x: Any) -> Any:
        with gathering():
            return self.model(x, training=False)

    def _test_update(self, y: Any, y_pred: Any) -> Any:
        with gathering():
            return self._metrics_update(y, y_pred, self._loss(y, y_pred))

    def make_test_function(self, force: bool = False) -> Any:
        if self.test_function is not None and not force:
            return self.test_function
        forward, update = tf.function(self._infer), tf.function(self._test_update)

        def test_function(iterator: Any) -> Any:
            x, y = next(iterator)
            return update(y, forward(x))

        self.test_function = test_function
        return test_function

    def _dataset(self, x: Any, y: Any, batch_size: Any, shuffle: bool,
                 names: str = "x and y") -> tuple[Any, int | None]:
        return mesh_dataset(self.layout, self.dmesh, x, y, batch_size, shuffle, names)

    def fit(self, x: Any = None, y: Any = None, batch_size: Any = None, epochs: int = 1, verbose: Any = "auto",
            callbacks: Any = None, shuffle: bool = True, steps_per_epoch: Any = None, validation_split: float = 0.0,
            validation_data: Any = None, validation_steps: Any = None, validation_batch_size: Any = None,
            **kwargs: Any) -> Any:
        if validation_split and validation_data is None:
            x, y, validation_data = held_out(x, y, validation_split)
        dataset, steps = self._dataset(x, y, batch_size, shuffle)
        if validation_data is not None:
            validation_data, counted = self._dataset(*validation_pair(validation_data),
                                                     validation_batch_size or batch_size, shuffle=False,
                                                     names="validation x and y")
            validation_steps = validation_steps or counted
            if validation_steps is None:
                raise ValueError("validation_steps must be given with a dtensor.DTensorDataset as validation_data. "
                                 "Received: validation_steps=None")
        return super().fit(dataset, epochs=epochs, verbose=verbose, callbacks=callbacks,
                           steps_per_epoch=steps_per_epoch or steps, validation_data=validation_data,
                           validation_steps=validation_steps, **kwargs)

    def evaluate(self, x: Any = None, y: Any = None, batch_size: Any = None, verbose: Any = "auto",
                 steps: Any = None, **kwargs: Any) -> Any:
        dataset, count = self._dataset(x, y, batch_size, shuffle=False)
        return super().evaluate(dataset, verbose=verbose, steps=steps or count, **kwargs)

    def predict(self, x: Any, batch_size: Any = None, verbose: Any = 0, **kwargs: Any) -> Any:
        import numpy as np

        batch_size = positive_int("batch_size", 32 if batch_size is None else batch_size)
        x = np.asarray(x)
        forward = tf.function(self._infer)
        outputs = []
        for start in range(0, len(x), batch_size):
            xb = dtensor.copy_to_mesh(x[start:start + batch_size], dtensor.Layout.replicated(self.dmesh, x.ndim))
            outputs.append(host_value(forward(xb)))
        return np.concatenate(outputs)

    def get_weights(self) -> list[Any]:
        return [host_value(v) for v in self.model.weights]

