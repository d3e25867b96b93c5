"""A Keras 3 model on a DTensor mesh: its weights laid out as they are created, its own ``fit`` run.

Keras 3's TensorFlow backend has no distribution (keras-team/keras#18473: its TensorFlow
``distribution_lib`` is a marked prototype, ``keras.distribution`` is JAX's). ``Mesh.scope()`` gives
a Keras 3 model what it gives a tf_keras one, by other means (measured on TensorFlow 2.21, Keras
3.15.1, a 2x2 mesh of CPUs):

1. Every variable Keras 3 creates inside the scope is a :class:`MeshVariable` (a
   ``dtensor.DVariable``) as its ``keras.Variable``'s ``value``: a layer's weights laid out by the
   layout's rules (:class:`~.keras_layout.KerasLayout`, the layer read from Keras 3's name scope),
   an optimizer's slots like their weight, counters and metric totals replicated.
2. ``compile`` inside the scope is Keras 3's own, then builds the optimizer there (Keras 3 builds
   it at the first step, inside a ``tf.function``, where no DVariable can be made); ``fit`` and
   ``evaluate`` build the compiled loss and metrics from the first batch's shapes for the same reason.
3. ``fit`` and ``evaluate`` are Keras 3's own loops (callbacks, progress bar, history, validation)
   over a ``dtensor.DTensorDataset`` made from the arrays, with each step as two functions
   (:func:`tensorfleet.compat.keras3.split_train_function`: Keras 3's one-function step logged a
   stale loss and ended 0.048 from one device's weights; split, within 3.5e-6).
4. :class:`MeshVariable` gathers its shards for ``numpy()`` and puts host values on the mesh in
   ``assign``: Keras 3's own ``get_weights``, ``set_weights``, ``save``, ``save_weights`` and
   ``load_weights`` work as they are; ``save`` writes a ``.keras`` file any one device loads.
5. ``predict`` runs the forward pass on whole (replicated) batches and gathers the outputs.
6. Gradients come from ``tf.gradients`` under the tf_keras trainer's AvgPool gradient override
   (DTensor has no layout propagation for ``AvgPoolGrad``); an Embedding's sparse gradient stays
   sparse, its rows whole (Keras 3's optimizers update only the rows it names, as on one device).

What the tf_keras path has beyond this (see :mod:`.keras_layout`): ZeRO stages 1-3 (a Keras 3
model with ``zero`` > 0 is one clear error at its ``compile``), and the layers it rewrites for
DTensor: pooling and Concatenate over a tensor split along a non-batch axis (on Keras 3 DTensor
stops the first step: "All operands and outputs must be batch parallel"), DepthwiseConv2D, and
Dropout masks equal to one device's (on Keras 3 DTensor draws each shard's mask; every device's
copy of a weight stays equal, checked shard by shard, but the masks are not one device's).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from tensorfleet.model_parallel.mesh.keras_layout import KerasLayout

__all__ = ["Keras3Trainer", "MeshModel", "attach", "keras3_variable"]


def _mesh_variable_class() -> type:
    from tensorflow.experimental import dtensor

    global _MESH_VARIABLE
    if _MESH_VARIABLE is None:
        class MeshVariable(dtensor.DVariable):
            """A DVariable that Keras 3 can read and write with host values: ``numpy()`` gathers the shards,
            ``assign`` of a value that is no DTensor (outside a function) copies it to the mesh first."""

            def numpy(self) -> Any:
                from tensorfleet.model_parallel.mesh.keras_model import host_value

                return host_value(self)

            def assign(self, value: Any, use_locking: Any = None, name: Any = None, read_value: bool = True) -> Any:
                import tensorflow as tf

                if tf.executing_eagerly() and not dtensor.is_dtensor(value):
                    value = on_mesh(tf.convert_to_tensor(value, dtype=self.dtype), self.layout)
                return super().assign(value, use_locking=use_locking, name=name, read_value=read_value)

        _MESH_VARIABLE = MeshVariable
    return _MESH_VARIABLE


_MESH_VARIABLE: type | None = None


def on_mesh(value: Any, layout: Any) -> Any:
    """The host tensor ``value`` as a DTensor of ``layout``."""
    from tensorflow.experimental import dtensor

    whole = dtensor.copy_to_mesh(value, dtensor.Layout.replicated(layout.mesh, rank=value.shape.rank))
    return dtensor.relayout(whole, layout)


def keras3_variable(building: tuple[Any, str], init: Any, name: str, layout: KerasLayout, dmesh: Any,
                    options: dict[str, Any]) -> Any:
    """The :class:`MeshVariable` for a variable Keras 3 creates (``building``: its creator and name-scope path,
    :func:`tensorfleet.compat.keras3.building`), from its initial value ``init`` (a host tensor)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from tensorfleet.compat.keras import keras3, tf_variable
    from tensorfleet.compat.keras3 import slot_reference

    caller, scope = building
    reference = slot_reference()
    if reference is not None:  # an optimizer's slot: laid out like its weight
        target = tf_variable(reference).layout
    elif isinstance(caller, keras3().layers.Layer):
        path = f"{scope}/{name}" if scope else name
        axes = layout.weight(caller, path, name, init.shape).mesh_axes
        target = dtensor.Layout([a if a is not None else dtensor.UNSHARDED for a in axes], dmesh)
    else:  # an optimizer's counters, a metric's totals, a seed generator's state
        target = dtensor.Layout.replicated(dmesh, init.shape.rank)
    with tf.init_scope():
        # A slot's zeros are made next to its weight (Keras 3 colocates them), so on the mesh already; on the mesh
        # of an earlier scope, when meshes of other shapes were made before (DTensor's default), so through the host
        if dtensor.is_dtensor(init) and dtensor.fetch_layout(init).mesh != dmesh:
            from tensorfleet.model_parallel.mesh.keras_model import host_value

            init = tf.convert_to_tensor(host_value(init))
        value = dtensor.relayout(init, target) if dtensor.is_dtensor(init) else on_mesh(init, target)
    return _mesh_variable_class()(value, **options)


class Keras3Trainer:
    """What ``compile`` of a Keras 3 model inside ``Mesh.scope()`` attaches to it (see the module)."""

    weights_on_mesh = True

    def __init__(self, model: Any, layout: KerasLayout, dmesh: Any, *, zero: int = 0) -> None:
        if zero:
            raise ValueError("ZeRO on a mesh (Mesh(..., zero=1..3)) trains tf_keras models only: a Keras 3 model "
                             "trains with zero=0 (every optimizer slot laid out like its weight), or build it with "
                             f"`import tf_keras as keras` for ZeRO. Received: zero={zero} and a Keras 3 model "
                             f"{model.name!r}")
        self.layout = layout
        self.dmesh = dmesh

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Variables Keras 3 creates inside are laid out on the mesh."""
        import tensorflow as tf

        from tensorfleet.model_parallel.mesh.keras_model import creator

        with tf.variable_creator_scope(creator(self.layout, self.dmesh, 0)):
            yield

    def compile(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        from tensorfleet.compat.keras3 import slots_like_references, trainer_compile

        args, kwargs = self._optimizer_on_mesh(model, args, kwargs)
        with self.scope():
            trainer_compile(model, *args, **kwargs)
            with slots_like_references(model.optimizer):
                model.optimizer.build(model.trainable_variables)
        model.train_function = model.test_function = None

    def _optimizer_on_mesh(self, model: Any, args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """An optimizer object made before the scope (its counters off the mesh) or built already (its slots
        someone else's) is replaced by a fresh one of the same configuration, made on the mesh."""
        from tensorflow.experimental import dtensor

        from tensorfleet.compat.keras import keras3, tf_variable

        optimizer = args[0] if args else kwargs.get("optimizer", "rmsprop")
        if not isinstance(optimizer, keras3().optimizers.Optimizer):
            return args, kwargs
        counters = [tf_variable(v) for v in optimizer.variables]
        if not optimizer.built and all(isinstance(v, dtensor.DVariable) and v.layout.mesh == self.dmesh
                                       for v in counters):
            return args, kwargs
        with self.scope():
            fresh = type(optimizer).from_config(optimizer.get_config())
        return ((fresh,) + tuple(args[1:]), kwargs) if args else (args, {**kwargs, "optimizer": fresh})

    def build_state(self, model: Any, x: Any, y: Any) -> None:
        """The compiled loss and metrics created on the mesh, from the first batch of ``x, y`` (arrays)."""
        from tensorfleet.compat.keras3 import build_state

        with self.scope():
            build_state(model, x, y)


class MeshModel:
    """What a Keras 3 model compiled inside ``Mesh.scope()`` becomes: the same object, its class this mixin over
    its own, whose ``compile`` lays out the optimizer, whose ``fit`` and ``evaluate`` are Keras 3's over a
    ``DTensorDataset`` with steps of two functions, and whose ``predict`` gathers outputs. Weights read and
    write through Keras 3's own methods (:class:`MeshVariable`)."""

    mesh_trainer: Any = None
    # Keras 3's, from the model class this mixin is combined with:
    train_function: Any
    test_function: Any
    __call__: Callable[..., Any]

    def compile(self, *args: Any, **kwargs: Any) -> None:
        self.mesh_trainer.compile(self, args, kwargs)

    def make_train_function(self, force: bool = False) -> Any:
        from tensorfleet.compat.keras3 import split_train_function
        from tensorfleet.model_parallel.mesh.keras_trainer import AVG_POOL_GRADIENT

        if self.train_function is None or force:
            # AvgPoolGrad has no layout propagation in DTensor: the tf_keras trainer's gradient for it
            self.train_function = split_train_function(self, _like_variable, {"AvgPool": AVG_POOL_GRADIENT})
        return self.train_function

    def make_test_function(self, force: bool = False) -> Any:
        from tensorfleet.compat.keras3 import split_test_function

        if self.test_function is None or force:
            self.test_function = split_test_function(self)
        return self.test_function

    def _mesh_batches(self, x: Any, y: Any, batch_size: Any, shuffle: bool, names: str = "x and y") -> tuple[Any, Any]:
        from tensorfleet.model_parallel.mesh.keras_data import mesh_dataset

        trainer = self.mesh_trainer
        dataset, steps = mesh_dataset(trainer.layout, trainer.dmesh, x, y, batch_size, shuffle, names)
        if steps is not None:
            trainer.build_state(self, x[:1], y[:1])
        return dataset, steps

    def fit(self, x: Any = None, y: Any = None, batch_size: Any = None, epochs: int = 1, verbose: Any = "auto",
            callbacks: Any = None, validation_split: float = 0.0, validation_data: Any = None, shuffle: bool = True,
            steps_per_epoch: Any = None, validation_steps: Any = None, validation_batch_size: Any = None,
            **kwargs: Any) -> Any:
        from tensorfleet.model_parallel.mesh.keras_data import held_out, validation_pair

        _refuse_weighting(kwargs)
        if validation_split and validation_data is None:
            x, y, validation_data = held_out(x, y, validation_split)
        dataset, steps = self._mesh_batches(x, y, batch_size, shuffle)
        if validation_data is not None:
            validation_data, counted = self._mesh_batches(*validation_pair(validation_data),
                                                          validation_batch_size or batch_size, shuffle=False,
                                                          names="validation x and y")
            validation_steps = validation_steps or counted
            if validation_steps is None:
                raise ValueError("validation_steps must be given with a dtensor.DTensorDataset as validation_data. "
                                 "Received: validation_steps=None")
        # shuffle=False: the DTensorDataset shuffles (when asked), and Keras warns of a dataset it would shuffle
        return super().fit(dataset, epochs=epochs, verbose=verbose, callbacks=callbacks, shuffle=False,  # type: ignore[misc]
                           steps_per_epoch=steps_per_epoch or steps, validation_data=validation_data,
                           validation_steps=validation_steps, **kwargs)

    def evaluate(self, x: Any = None, y: Any = None, batch_size: Any = None, verbose: Any = "auto",
                 steps: Any = None, **kwargs: Any) -> Any:
        _refuse_weighting(kwargs)
        dataset, count = self._mesh_batches(x, y, batch_size, shuffle=False)
        return super().evaluate(dataset, verbose=verbose, steps=steps or count, **kwargs)  # type: ignore[misc]

    def predict(self, x: Any, batch_size: Any = None, verbose: Any = 0, **kwargs: Any) -> Any:
        import numpy as np
        import tensorflow as tf
        from tensorflow.experimental import dtensor

        from tensorfleet.model_parallel.mesh.keras_model import host_value
        from tensorfleet.validation import positive_int

        if kwargs:
            raise ValueError("predict on a mesh takes x, batch_size and verbose. Received: "
                             f"{', '.join(sorted(kwargs))}")
        batch_size = positive_int("batch_size", 32 if batch_size is None else batch_size)
        x = np.asarray(x)
        forward = tf.function(lambda xb: self(xb, training=False))
        mesh = self.mesh_trainer.dmesh
        outputs = [host_value(forward(dtensor.copy_to_mesh(x[i:i + batch_size],
                                                           dtensor.Layout.replicated(mesh, x.ndim))))
                   for i in range(0, len(x), batch_size)]
        return np.concatenate(outputs)


def _like_variable(gradient: Any, variable: Any) -> Any:
    """``gradient`` laid out as ``variable``. An Embedding's ``IndexedSlices`` stay sparse, their rows and
    indices whole on every device: Keras 3's optimizers update only the rows a sparse gradient names
    (``scatter_add``), so made dense it trains otherwise than one device (the small GPT's weights ended
    0.046 apart); its rows left as DTensor expanded them (a partial sum over a split ``hidden``) ended
    0.045 apart."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    if isinstance(gradient, tf.IndexedSlices):
        mesh = variable.layout.mesh

        def whole(t: Any) -> Any:
            return dtensor.relayout(t, dtensor.Layout.replicated(mesh, t.shape.rank))

        return tf.IndexedSlices(whole(gradient.values), whole(gradient.indices), gradient.dense_shape)
    return dtensor.relayout(gradient, variable.layout)


def _refuse_weighting(kwargs: dict[str, Any]) -> None:
    given = sorted(k for k in ("sample_weight", "class_weight") if kwargs.get(k) is not None)
    if given:
        raise ValueError(f"A model on a mesh trains on x and y without {' or '.join(given)}. Received: "
                         f"{', '.join(given)}")


_CLASSES: dict[type, type] = {}


def attach(model: Any, trainer: Keras3Trainer) -> Any:
    """``model`` made :class:`MeshModel`, trained through ``trainer``; returns it."""
    cls = type(model)
    if not issubclass(cls, MeshModel):
        if cls not in _CLASSES:
            _CLASSES[cls] = type(cls.__name__, (MeshModel, cls), {"__module__": cls.__module__, "__doc__": cls.__doc__})
        model.__class__ = _CLASSES[cls]
    object.__setattr__(model, "mesh_trainer", trainer)
    return model
