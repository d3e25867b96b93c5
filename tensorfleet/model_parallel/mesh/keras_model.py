"""Plain Keras on a mesh: weights laid out as they are created, and the user's own model trained.

:func:`mesh_scope` is what ``Mesh.scope()`` enters (``backend="dtensor"``): every variable a Keras
layer creates inside it becomes a ``dtensor.DVariable`` laid out by
:class:`~.keras_layout.KerasLayout`. :func:`compile_on_mesh` is the scope's compile hook: the
user's model compiled inside becomes :class:`OnMesh` (the same object), whose ``compile``,
``fit``, ``evaluate``, ``predict``, ``get_weights`` and ``save`` are those of its trainer, a
:class:`~.keras_trainer.MeshTrainer` (Keras' own loops, with what TF 2.14's DTensor lacks supplied
underneath, see the design in :mod:`.keras_layout`: batches
from a ``DTensorDataset``, each training step as two functions (gradients, then the update and the
metrics), gradients relaid out like their variables, fused normalizations off, optimizers rebuilt
with the mesh so their slots are laid out like their variables, and weights gathered to the host.
ZeRO stages 1-3 over the batch axis (``Mesh(..., zero=)``) are in :mod:`.zero`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from tensorfleet.compat.keras import keras2
from tensorfleet.model_parallel.mesh.keras_layout import KerasLayout

__all__ = ["OnMesh", "attach", "clip_gradients", "compile_on_mesh", "dtensor_trainer", "host_value", "mesh_scope",
           "require_laid_out", "with_mesh"]


def host_value(variable: Any) -> Any:
    """The whole value of a (possibly sharded) DVariable or DTensor as a numpy array."""
    from tensorflow.experimental import dtensor

    value = variable.read_value() if hasattr(variable, "read_value") else variable
    try:
        layout = dtensor.fetch_layout(value)
    except Exception:  # not a DTensor
        return value.numpy()
    whole = dtensor.relayout(value, dtensor.Layout.replicated(layout.mesh, rank=len(value.shape)))
    return dtensor.unpack(whole)[0].numpy()


def creator(layout: KerasLayout, dmesh: Any, zero: int) -> Any:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from tensorfleet.compat.keras3 import building
    from tensorfleet.compat.tf_keras import build_call_context
    from tensorfleet.model_parallel.mesh.zero import ZeroVariable, zero_layout

    def create(next_creator: Any, **kwargs: Any) -> Any:
        init = kwargs["initial_value"]
        with tf.init_scope():  # a Keras 3 metric built while a step is traced gives a callable made in it
            if callable(init):
                init = init()
            init = tf.convert_to_tensor(init, dtype=kwargs.get("dtype"))
        name = kwargs.get("name") or "Variable"
        trainable = kwargs.get("trainable") is not False
        options = dict(trainable=trainable, name=name, constraint=kwargs.get("constraint"))
        keras3_building = building()
        if keras3_building is not None:  # Keras 3 creates it
            from tensorfleet.model_parallel.mesh.keras3_model import keras3_variable

            return keras3_variable(keras3_building, init, name, layout, dmesh, options)
        layer = None
        if dtensor.is_dtensor(init):  # e.g. an optimizer slot made with zeros_like(variable)
            value = init
        else:
            layer, layer_inputs = build_call_context()  # the Keras layer being built, and what it reads
            scope = tf.get_current_name_scope()
            path = f"{scope}/{name}" if scope else name
            inputs = tf.nest.flatten(layer_inputs) if layer_inputs is not None else []
            input_rank = max((t.shape.rank or 0 for t in inputs if hasattr(t, "shape")), default=2)
            axes = (layout.weight(layer, path, name, init.shape, input_rank).mesh_axes
                    if layer is not None else (None,) * init.shape.rank)
            spec = [a if a is not None else dtensor.UNSHARDED for a in axes]
            value = dtensor.relayout(dtensor.copy_to_mesh(init, dtensor.Layout.replicated(dmesh, init.shape.rank)),
                                     dtensor.Layout(spec, dmesh))
        if zero >= 3 and trainable and layer is not None and init.dtype.is_floating:
            compute = dtensor.fetch_layout(value)
            stored = zero_layout(compute, init.shape, layout.batch_axis)
            if stored is not compute:  # ZeRO stage 3: stored split over the batch axis, gathered to compute
                return ZeroVariable(dtensor.relayout(value, stored), compute_layout=compute, **options)
        return dtensor.DVariable(value, **options)

    return create


@contextlib.contextmanager
def mesh_scope(layout: KerasLayout, dmesh: Any, *, zero: int = 0) -> Iterator[KerasLayout]:
    """Lays out every Keras weight created inside; Keras' own layout-map scope keeps its counters
    and loss containers on the mesh too. With ``zero=3`` trainable weights are stored split over
    the batch axis as well (:class:`~.zero.ZeroVariable`)."""
    import tensorflow as tf

    from tensorfleet.compat.tf_keras import layout_map_scope

    keras_map = keras2().dtensor.experimental.LayoutMap(mesh=dmesh)
    # Keras' random layers (Dropout, also inside MultiHeadAttention) on a mesh need a tf.random.Generator
    # (their state is a DVariable); the process-wide choice is restored when the scope ends.
    generator = keras2().backend.experimental.is_tf_random_generator_enabled()
    keras2().backend.experimental.enable_tf_random_generator()
    try:
        with layout_map_scope(keras_map), tf.variable_creator_scope(creator(layout, dmesh, zero)):
            yield layout
    finally:
        if not generator:
            keras2().backend.experimental.disable_tf_random_generator()


def with_mesh(optimizer: Any, dmesh: Any) -> Any:
    """``optimizer`` rebuilt from its config with ``mesh=``, so that Keras creates its slots (and
    step counter, learning rate) as DVariables laid out like the weights."""

    from tensorfleet.compat.tf_keras import optimizer_mesh

    optimizer = keras2().optimizers.get(optimizer)
    takes_mesh, built_with = optimizer_mesh(optimizer)
    if takes_mesh and built_with is dmesh:
        return optimizer
    if not takes_mesh:
        raise ValueError(f"A mesh trains with Keras' optimizers (tf.keras.optimizers.SGD, Adam, AdamW, ...), which can "
                         f"lay out their slots. Received: optimizer={optimizer!r}")
    config = optimizer.get_config()
    for name in ("clipnorm", "clipvalue", "global_clipnorm"):  # applied by the trainer: see clip_gradients
        config.pop(name, None)
    if isinstance(optimizer, keras2().optimizers.SGD) and not config.get("momentum"):
        # With momentum exactly 0, TF 2.14's DTensor loses the layout of Keras' "m * momentum" (folded to a
        # constant) and the update fails ("Incompatible shapes: [4] vs. [8]" in SGD/add); 1e-30 x m is below
        # what float32 weights of the size of a step can show.
        config["momentum"] = 1e-30
    if isinstance(config.get("learning_rate"), dict):
        config["learning_rate"] = keras2().optimizers.schedules.deserialize(config["learning_rate"])
    rebuilt = type(optimizer)(**config, mesh=dmesh)
    rebuilt.mesh_clipping = {n: getattr(optimizer, n, None) for n in ("clipnorm", "clipvalue", "global_clipnorm")}
    return rebuilt


def clip_gradients(grads: list[Any], clipping: dict[str, Any]) -> list[Any]:
    """Keras' gradient clipping, done by the trainer: as Keras' optimizers do, only the first set of
    ``clipnorm``, ``global_clipnorm`` and ``clipvalue`` applies."""
    import tensorflow as tf

    if clipping.get("clipnorm"):
        return [g if g is None else tf.clip_by_norm(g, clipping["clipnorm"]) for g in grads]
    if clipping.get("global_clipnorm"):
        return list(tf.clip_by_global_norm(grads, clipping["global_clipnorm"])[0])
    if clipping.get("clipvalue"):
        return [g if g is None else tf.clip_by_value(g, -clipping["clipvalue"], clipping["clipvalue"]) for g in grads]
    return grads


class OnMesh:
    """What a Keras model compiled inside ``Mesh.scope()`` becomes: the same object, its class
    this mixin over its own (``isinstance`` and everything else unchanged), whose ``compile``,
    ``fit``, ``evaluate``, ``predict``, ``get_weights`` and ``save`` are its
    :attr:`mesh_trainer`'s (:class:`~.keras_trainer.MeshTrainer`: Keras' own loops with what DTensor
    lacks supplied underneath). ``save`` writes a one-device copy: its weights gathered from the
    shards, compiled with the same loss and metrics and a fresh optimizer of the same
    configuration (the optimizer's state is not saved); ``tf.keras.models.load_model`` reads it
    anywhere. A model that has no trainer (a one-device copy) keeps Keras' own methods.
    """

    mesh_trainer: Any = None
    """The trainer of this model's weights on the mesh; set by ``compile`` inside ``Mesh.scope()``."""
    # Keras', from the model class this mixin is combined with:
    name: str
    weights: list[Any]

    def compile(self, *args: Any, **kwargs: Any) -> None:
        if self.mesh_trainer is None:
            return super().compile(*args, **kwargs)  # type: ignore[misc]
        self.mesh_trainer.compile(*args, **kwargs)
        object.__setattr__(self, "mesh_compiled", (args, kwargs))
        return None

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        trainer = self.mesh_trainer
        return super().fit(*args, **kwargs) if trainer is None else trainer.fit(*args, **kwargs)  # type: ignore[misc]

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        trainer = self.mesh_trainer
        return super().evaluate(*args, **kwargs) if trainer is None else trainer.evaluate(*args, **kwargs)  # type: ignore[misc]

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        trainer = self.mesh_trainer
        return super().predict(*args, **kwargs) if trainer is None else trainer.predict(*args, **kwargs)  # type: ignore[misc]

    def get_weights(self) -> list[Any]:
        if not getattr(self.mesh_trainer, "weights_on_mesh", False):  # no trainer, or one that writes them back
            return super().get_weights()  # type: ignore[misc]
        return [host_value(v) for v in self.weights]

    @property
    def optimizer(self) -> Any:
        """The optimizer ``compile`` gave the trainer (its slots laid out like the weights)."""
        trainer = self.mesh_trainer
        return None if trainer is None else getattr(trainer, "optimizer", None)

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        if value is not None:
            raise AttributeError("A model on a mesh takes its optimizer from compile(optimizer=...). "
                                 f"Received: optimizer={value!r}")

    def save(self, filepath: Any, *args: Any, **kwargs: Any) -> None:
        """Writes a one-device copy of the model (see the class); takes Keras' ``save`` arguments."""

        copy = self.one_device_copy()
        compiled = self.__dict__.get("mesh_compiled")
        if compiled is not None:
            cargs, ckwargs = compiled
            ckwargs = dict(ckwargs)
            optimizer = cargs[0] if cargs else ckwargs.pop("optimizer", "rmsprop")
            if not isinstance(optimizer, str):
                optimizer = keras2().optimizers.get(optimizer).__class__.from_config(optimizer.get_config())
            copy.compile(optimizer, *cargs[1:], **ckwargs)
            _copy_optimizer_state(self.mesh_trainer.optimizer, copy)
        copy.save(filepath, *args, **kwargs)

    def one_device_copy(self) -> Any:
        """A model of the same layers on one device, with this model's weights gathered from the shards."""

        on_mesh = type(self)
        plain = next(c for c in on_mesh.__mro__[1:] if not issubclass(c, OnMesh))
        setattr(self, "__class__", plain)  # Keras clones its class
        try:
            copy = keras2().models.clone_model(self)
        except (ValueError, NotImplementedError) as exc:  # a subclassed model without get_config
            raise ValueError(f"Model {self.name!r} on a mesh can be saved whole only if Keras can rebuild it "
                             "from its config (Sequential, functional, or get_config/from_config); otherwise "
                             f"save_weights() and rebuild it yourself. Received: {type(exc).__name__}: {exc}") from exc
        finally:
            self.__class__ = on_mesh
        # By name: a Dropout built in the scope keeps its random generator's state as a weight, its copy has none
        by_name = {w.name: w for w in self.weights}
        if all(w.name in by_name for w in copy.weights):
            copy.set_weights([host_value(by_name[w.name]) for w in copy.weights])
        else:
            copy.set_weights(self.get_weights())
        return copy


def _copy_optimizer_state(optimizer: Any, copy: Any) -> None:
    """The mesh optimizer's state (step count, slots, gathered from their shards) into the optimizer of
    ``copy``, built for its weights, when both hold the same variables (an SGD without momentum on the
    mesh keeps a momentum slot, see :func:`with_mesh`: its copy starts fresh)."""
    import tensorflow as tf

    with tf.name_scope(copy.optimizer.name):  # as apply_gradients builds it: "Adam/m/<weight>"
        copy.optimizer.build(copy.trainable_variables)
    source, target = list(optimizer.variables), list(copy.optimizer.variables)
    if len(source) == len(target) and all(tuple(a.shape) == tuple(b.shape) for a, b in zip(source, target)):
        for src, dst in zip(source, target):
            dst.assign(host_value(src))


_ON_MESH: dict[type, type] = {}


def _on_mesh_class(cls: type) -> type:
    """``cls`` with :class:`OnMesh` mixed in, made once per class; named and placed like ``cls`` so that
    Keras' serialization records the model's own class."""
    if issubclass(cls, OnMesh):
        return cls
    if cls not in _ON_MESH:
        _ON_MESH[cls] = type(cls.__name__, (OnMesh, cls), {"__module__": cls.__module__, "__doc__": cls.__doc__})
    return _ON_MESH[cls]


def require_laid_out(model: Any, dmesh: Any) -> None:
    """One clear error, before any step, for a model whose weights this mesh did not lay out."""
    from tensorflow.experimental import dtensor

    if not model.weights:
        raise ValueError(f"Model {model.name!r} has no weights yet, so the mesh has laid none out: build it inside "
                         "mesh.scope() (give it an Input, or call it once on a batch) before compile. Received: an "
                         "unbuilt model")
    from tensorfleet.compat.keras import is_keras3_model, tf_variable

    foreign = []
    for weight in model.weights:
        variable = tf_variable(weight)
        if not (isinstance(variable, dtensor.DVariable) and variable.layout.mesh == dmesh):
            foreign.append(weight.path if is_keras3_model(model) else weight.name)
    if foreign:
        raise ValueError(f"Model {model.name!r} has weights this mesh did not lay out ({', '.join(foreign[:4])}"
                         f"{', ...' if len(foreign) > 4 else ''}): build the model inside mesh.scope(), not before it, "
                         f"then compile it there. Received: {len(foreign)} of {len(model.weights)} weights off the "
                         "mesh")


def compile_on_mesh(make_trainer: Any) -> Any:
    """The compile hook of ``Mesh.scope()`` (:func:`tensorfleet.compat.keras.intercept_compile`): a
    user's model compiled inside becomes :class:`OnMesh`, its trainer ``make_trainer(model)``
    (which checks first that the mesh can run the model); a trainer's own compile is Keras'."""

    def hook(model: Any, keras_compile: Any, *args: Any, **kwargs: Any) -> Any:
        from tensorfleet.compat.keras import is_keras3_model, require_keras2

        if getattr(model, "trains_on_mesh", False):  # a trainer (MeshTrainer, StepTrainer) compiling itself
            return keras_compile(model, *args, **kwargs)
        if is_keras3_model(model) and getattr(make_trainer, "takes_keras3", False):
            from tensorfleet.model_parallel.mesh import keras3_model

            if not isinstance(model, keras3_model.MeshModel):
                keras3_model.attach(model, make_trainer(model))
            return model.compile(*args, **kwargs)
        require_keras2(model, "model.compile inside Mesh.scope()")
        if not isinstance(model, OnMesh) or model.mesh_trainer is None:
            attach(model, make_trainer(model))
        return model.compile(*args, **kwargs)

    return hook


def attach(model: Any, trainer: Any) -> Any:
    """``model`` made :class:`OnMesh`, trained by ``trainer``; returns it."""
    model.__class__ = _on_mesh_class(type(model))
    object.__setattr__(model, "mesh_trainer", trainer)
    return model


def dtensor_trainer(model: Any, layout: KerasLayout, dmesh: Any, *, zero: int = 0) -> Any:
    """The :class:`~.keras_trainer.MeshTrainer` of ``model``, built inside ``Mesh.scope()`` (one clear
    error first if the mesh did not lay out its weights)."""
    from tensorfleet.compat.keras import is_keras3_model

    require_laid_out(model, dmesh)
    if is_keras3_model(model):
        from tensorfleet.model_parallel.mesh.keras3_model import Keras3Trainer

        return Keras3Trainer(model, layout, dmesh, zero=zero)
    from tensorfleet.model_parallel.mesh.keras_trainer import MeshTrainer

    return MeshTrainer(model, layout, dmesh, zero=zero)
