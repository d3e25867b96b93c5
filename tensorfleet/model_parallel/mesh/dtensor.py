"""The ``dtensor`` mesh backend: every Keras weight a DTensor DVariable laid out by the rules.

Each weight's layout comes from the rules for its tensor dimensions (a dimension no rule names
is replicated), the batch is laid out the same way, and the model's function runs on the
``tf.experimental.dtensor`` mesh, where TensorFlow's SPMD expansion inserts the collectives. The
training step is a ``tf.function`` (in TF 2.14 DTensor's eager gradients of the loss fail to
expand); the loop over batches and epochs is Keras' ``fit``
(:class:`~tensorfleet.model_parallel.mesh.step_trainer.StepTrainer`). This is the form
``Mesh.fit`` gives the dtensor backend for the chain models the other backends run, so that the
three compare step for step; a model of any other kind, and any Keras optimizer, trains on the
same DTensor mesh built inside ``Mesh.scope()`` (:mod:`.keras_model`). It shares a process with
mirrored strategies built by tensorfleet (``strategies.build("mirrored")``), which take collective keys of their own; in
TF 2.14 DTensor's collectives and those of a ``tf.distribute.MirroredStrategy`` built directly take the
same group key, and whichever runs second fails with "... is joining a group that is already
full (group_key=1)".
"""

from __future__ import annotations

import math
from typing import Any, Callable

from tensorfleet.compat.tf_keras import attention_parts
from tensorfleet.model_parallel.mesh.dimensions import MeshStep, mesh_steps
from tensorfleet.model_parallel.mesh.step_trainer import MeshRun
from tensorfleet.model_parallel.mesh.training import count_devices

__all__ = ["prepare"]

BACKEND = "dtensor"  # MeshBackend value: this module is named after it


def _weight_dimensions(steps: list[MeshStep]) -> list[tuple[Any, tuple[str, ...]]]:
    """Every Keras weight of the model with the names of its tensor dimensions, in model order."""
    named: list[tuple[Any, tuple[str, ...]]] = []
    previous = "features"
    for step in steps:
        if step.kind == "dense":
            named += [(step.layer.kernel, (previous, step.out_dim))]
            if step.layer.use_bias:
                named += [(step.layer.bias, (step.out_dim,))]
            previous = step.out_dim
        elif step.kind == "block":
            attention, block = attention_parts(step.layer.attention), step.layer
            for dense in attention.projections.values():
                named += [(dense.kernel, ("d_model", "heads", "kv"))]
                if attention.use_bias:
                    named += [(dense.bias, ("heads", "kv"))]
            named += [(attention.output.kernel, ("heads", "kv", "d_model"))]
            if attention.use_bias:
                named += [(attention.output.bias, ("d_model",))]
            named += [(block.dense1.kernel, ("d_model", "hidden")), (block.dense1.bias, ("hidden",)),
                      (block.dense2.kernel, ("hidden", "d_model")), (block.dense2.bias, ("d_model",))]
    return named


def _forward(steps: list[MeshStep], w: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The model's function with every Keras weight ``v`` read as ``w(v)`` (its DVariable)."""
    import tensorflow as tf

    def forward(h: Any) -> Any:
        for step in steps:
            if step.kind == "dense":
                layer = step.layer
                h = tf.einsum("bsi,io->bso" if h.shape.rank == 3 else "bi,io->bo", h, w(layer.kernel))
                if layer.use_bias:
                    h = h + w(layer.bias)
                h = layer.activation(h)
            elif step.kind == "pool":
                h = tf.reduce_mean(h, axis=1)
            else:
                block, attention = step.layer, attention_parts(step.layer.attention)
                q, k, v = (tf.einsum("bsd,dhk->bshk", h, w(d.kernel)) + (w(d.bias) if attention.use_bias else 0.0)
                           for d in attention.projections.values())
                q = q * (1.0 / math.sqrt(float(block.key_dim)))
                scores = tf.nn.softmax(tf.einsum("btnh,bsnh->bnst", k, q), axis=-1)
                out = tf.einsum("bsnh,nhd->bsd", tf.einsum("bnst,btnh->bsnh", scores, v),
                                w(attention.output.kernel))
                if attention.use_bias:
                    out = out + w(attention.output.bias)
                h = h + out
                m = tf.nn.relu(tf.einsum("bsd,df->bsf", h, w(block.dense1.kernel)) + w(block.dense1.bias))
                h = h + tf.einsum("bsf,fd->bsd", m, w(block.dense2.kernel)) + w(block.dense2.bias)
        return h

    return forward


def prepare(mesh: Any, model: Any, dims: dict[str, int], *, x_shape: tuple[int, ...],
            learning_rate: float) -> MeshRun:
    """``model``'s weights as DVariables on a DTensor mesh, ready to train one step at a time
    (:class:`~.step_trainer.StepTrainer`); its ``finish`` writes the weights back."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    steps = mesh_steps(model)
    rules = mesh.layout.rules
    dmesh = dtensor.create_mesh(list(mesh.layout.mesh_dims.items()), devices=mesh.devices)

    def layout(*names: str) -> Any:
        return dtensor.Layout([rules.get(n, dtensor.UNSHARDED) for n in names], dmesh)

    def put(value: Any, target: Any) -> Any:
        return dtensor.relayout(dtensor.copy_to_mesh(value, dtensor.Layout.replicated(dmesh, rank=target.rank)), target)

    named = _weight_dimensions(steps)
    dvars = {source.ref(): dtensor.DVariable(put(source.numpy(), layout(*names))) for source, names in named}
    variables = list(dvars.values())
    forward = _forward(steps, lambda source: dvars[source.ref()])

    @tf.function
    def train_step(xb: Any, yb: Any) -> Any:
        # DTensor's eager gradients of the loss do not expand to DTensors in TF 2.14; a traced step does.
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, forward(xb)))
        for variable, grad in zip(variables, tape.gradient(loss, variables)):
            variable.assign_sub(learning_rate * grad)
        return loss

    x_layout = layout("batch", "seq", "features") if len(x_shape) == 3 else layout("batch", "features")
    y_layout = layout("batch")

    def finish() -> dict[str, Any]:
        placement: dict[str, int] = {}
        for (source, _), variable in zip(named, variables):
            for component in dtensor.unpack(variable.read_value()):
                key = count_devices([component.device]).popitem()[0]
                placement[key] = placement.get(key, 0) + int(component.shape.num_elements())
            whole = dtensor.relayout(variable.read_value(), dtensor.Layout.replicated(dmesh, rank=len(source.shape)))
            source.assign(dtensor.unpack(whole)[0].numpy())
        return {"placement": dict(sorted(placement.items()))}

    return MeshRun(lambda xb, yb: dtensor.unpack(train_step(put(xb, x_layout), put(yb, y_layout)))[0].numpy(), finish)
