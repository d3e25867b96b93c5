"""Plain Keras on a mesh: weights laid out as they are created, and a trainer for ``fit``.

:func:`mesh_scope` is what ``Mesh.scope()`` enters: every variable a Keras layer creates inside
it becomes a ``dtensor.DVariable`` laid out by :class:`~.keras_layout.KerasLayout`.
:func:`keras_mesh_model` is the one wrapper around the user's model (``Mesh.keras_model(model)``): a
``tf.keras.Model`` whose ``compile``, ``fit``, ``evaluate`` and ``predict`` are Keras' own, with
what TF 2.14's DTensor lacks supplied underneath (see the design in :mod:`.keras_layout`): batches
from a ``DTensorDataset``, each training step as two functions (gradients, then the update and the
metrics), gradients relaid out like their variables, fused normalizations off, optimizers rebuilt
with the mesh so their slots are laid out like their variables, and weights gathered to the host.
ZeRO stages 1-3 over the batch axis (``Mesh(..., zero=)``) are in :mod:`.zero`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from tensorfleet.model_parallel.mesh.keras_layout import KerasLayout

__all__ = ["clip_gradients", "host_value", "keras_mesh_model", "mesh_scope", "with_mesh"]


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


def _creator(layout: KerasLayout, dmesh: Any, zero: int) -> Any:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from tensorfleet.compat.keras import build_call_context

    from tensorfleet.model_parallel.mesh.zero import ZeroVariable, zero_layout

    def create(next_creator: Any, **kwargs: Any) -> Any:
        init = kwargs["initial_value"]
        if callable(init):
            with tf.init_scope():
                init = init()
        init = tf.convert_to_tensor(init, dtype=kwargs.get("dtype"))
        name = kwargs.get("name") or "Variable"
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
        trainable = kwargs.get("trainable") is not False
        options = dict(trainable=trainable, name=name, constraint=kwargs.get("constraint"))
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

    from tensorfleet.compat.keras import layout_map_scope

    keras_map = tf.keras.dtensor.experimental.LayoutMap(mesh=dmesh)
    # Keras' random layers (Dropout, also inside MultiHeadAttention) on a mesh need a tf.random.Generator
    # (their state is a DVariable); the process-wide choice is restored when the scope ends.
    generator = tf.keras.backend.experimental.is_tf_random_generator_enabled()
    tf.keras.backend.experimental.enable_tf_random_generator()
    try:
        with layout_map_scope(keras_map), tf.variable_creator_scope(_creator(layout, dmesh, zero)):
            yield layout
    finally:
        if not generator:
            tf.keras.backend.experimental.disable_tf_random_generator()


def with_mesh(optimizer: Any, dmesh: Any) -> Any:
    """``optimizer`` rebuilt from its config with ``mesh=``, so that Keras creates its slots (and
    step counter, learning rate) as DVariables laid out like the weights."""
    import tensorflow as tf

    from tensorfleet.compat.keras import optimizer_mesh

    optimizer = tf.keras.optimizers.get(optimizer)
    takes_mesh, built_with = optimizer_mesh(optimizer)
    if takes_mesh and built_with is dmesh:
        return optimizer
    if not takes_mesh:
        raise ValueError(f"A mesh trains with Keras' optimizers (tf.keras.optimizers.SGD, Adam, AdamW, ...), which can "
                         f"lay out their slots. Received: optimizer={optimizer!r}")
    config = optimizer.get_config()
    for name in ("clipnorm", "clipvalue", "global_clipnorm"):  # applied by the trainer: see clip_gradients
        config.pop(name, None)
    if isinstance(optimizer, tf.keras.optimizers.SGD) and not config.get("momentum"):
        # With momentum exactly 0, TF 2.14's DTensor loses the layout of Keras' "m * momentum" (folded to a
        # constant) and the update fails ("Incompatible shapes: [4] vs. [8]" in SGD/add); 1e-30 x m is below
        # what float32 weights of the size of a step can show.
        config["momentum"] = 1e-30
    if isinstance(config.get("learning_rate"), dict):
        config["learning_rate"] = tf.keras.optimizers.schedules.deserialize(config["learning_rate"])
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


def keras_mesh_model(model: Any, layout: KerasLayout, dmesh: Any, *, zero: int = 0) -> Any:
    """A Keras model that trains ``model`` with its weights laid out on ``dmesh``
    (``Mesh.keras_model(model)``).

    ``compile``, ``fit``, ``evaluate`` and ``predict`` are Keras' (callbacks, progress bar,
    ``History``); ``fit`` and ``evaluate`` take arrays (``x``, ``y``, ``batch_size``; full batches
    only, the batch split over the ``batch`` rule's mesh dimension) or a ``DTensorDataset`` with
    ``steps_per_epoch``; ``fit`` also ``validation_data`` (arrays or a ``DTensorDataset`` with
    ``validation_steps``) or ``validation_split``. ``get_weights()`` gathers the shards;
    ``trainer.model`` is the user's model, whose weights the trainer trains. ``zero``: the ZeRO
    stage (:mod:`.zero`).
    """
    from tensorfleet.model_parallel.mesh.keras_trainer import MeshTrainer

    return MeshTrainer(model, layout, dmesh, zero=zero)
