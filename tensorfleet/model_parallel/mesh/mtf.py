"""The ``mtf`` mesh backend: the Keras model written out as a Mesh-TensorFlow graph.

The model becomes ``mtf.einsum`` ops and ``mtf`` variables initialised from the Keras weights,
lowered by ``PlacementMeshImpl`` onto the devices and run in graph mode inside its own
``tf.Graph`` and ``tf.compat.v1.Session`` (eager mode stays on for everything else), one SGD step
at a time: the loop over batches and epochs is Keras' ``fit``
(:class:`~tensorfleet.model_parallel.mesh.step_trainer.StepTrainer`). When done, the trained values
go back into the Keras weights. :func:`prepare_mtf_model` runs a model the user wrote with
Mesh-TF layers the same way.
"""

from __future__ import annotations

import math
from typing import Any

from tensorfleet.compat.mesh_tf import import_mesh_tensorflow
from tensorfleet.compat.tf_keras import attention_parts
from tensorfleet.model_parallel.mesh.dimensions import mesh_steps
from tensorfleet.model_parallel.mesh.step_trainer import MeshRun
from tensorfleet.model_parallel.mesh.training import count_devices

__all__ = ["prepare", "prepare_mtf_model"]

BACKEND = "mtf"  # MeshBackend value: this module is named after it


def prepare(mesh: Any, model: Any, dims: dict[str, int], *, x_shape: tuple[int, ...],
            learning_rate: float) -> MeshRun:
    """The Keras ``model`` under ``mesh``'s layout as a Mesh-TF graph, ready to train one step at a
    time (:class:`~.step_trainer.StepTrainer`); its ``finish`` writes the weights back."""
    import numpy as np
    import tensorflow as tf

    steps = mesh_steps(model)
    snapshot = {v.ref(): v.numpy() for v in model.weights}  # Keras weights are eager; read them before the graph
    sources: dict[str, Any] = {}  # mtf variable name -> the Keras variable it starts from

    def build(mtf: Any, mtf_mesh: Any, h: Any, dim: dict[str, Any]) -> Any:
        def variable(name: str, shape: list, source: Any) -> Any:
            initializer = tf.compat.v1.constant_initializer(snapshot[source.ref()])
            tensor = mtf.get_variable(mtf_mesh, name, mtf.Shape(shape), initializer=initializer)
            sources[tensor.operation.name] = source
            return tensor

        for index, step in enumerate(steps):
            if step.kind == "dense":
                layer, in_dim, out_dim = step.layer, h.shape.dims[-1], dim[step.out_dim]
                w = variable(f"l{index}_kernel", [in_dim, out_dim], layer.kernel)
                h = mtf.einsum([h, w], output_shape=h.shape.dims[:-1] + [out_dim])
                if layer.use_bias:
                    h = h + variable(f"l{index}_bias", [out_dim], layer.bias)
                h = _activation(mtf, layer.activation.__name__, h)
            elif step.kind == "pool":
                h = mtf.reduce_mean(h, reduced_dim=dim["seq"])
            else:
                h = _block(mtf, h, step.layer, dim, lambda n, s, src, i=index: variable(f"l{i}_{n}", s, src))
        return h

    run = prepare_mtf_model(mesh, build, dims, x_shape=x_shape, learning_rate=learning_rate, seed=None)

    def finish() -> dict[str, Any]:
        record = run.finish()
        for name, source in sources.items():
            source.assign(np.asarray(record["weights"][name]).reshape(source.shape))
        return {**record, "weights": {}}

    return MeshRun(run.step, finish)


def prepare_mtf_model(mesh: Any, build: Any, dims: dict[str, int], *, x_shape: tuple[int, ...],
                      learning_rate: float, seed: int | None) -> MeshRun:
    """Builds ``build(mtf, mesh, inputs, dims) -> logits`` in its own graph and lowers it onto the
    mesh with PlacementMeshImpl, in a session of its own: ``step`` is one SGD step; ``finish``
    closes the session and records the op count per device and every Mesh-TF variable's value."""
    import tensorflow as tf

    mtf = import_mesh_tensorflow()
    graph = tf.Graph()
    with graph.as_default():
        if seed is not None:
            tf.compat.v1.set_random_seed(seed)
        mesh_graph = mtf.Graph()
        mtf_mesh = mtf.Mesh(mesh_graph, "tensorfleet_mesh")
        dim = {name: mtf.Dimension(name, size) for name, size in dims.items()}
        x_ph = tf.compat.v1.placeholder(tf.float32, x_shape, name="x")
        y_ph = tf.compat.v1.placeholder(tf.int32, (dims["batch"],), name="y")
        in_dims = [dim["batch"], dim["seq"], dim["features"]] if len(x_shape) == 3 else [dim["batch"], dim["features"]]
        inputs = mtf.import_tf_tensor(mtf_mesh, x_ph, mtf.Shape(in_dims))
        labels = mtf.import_tf_tensor(mtf_mesh, y_ph, mtf.Shape([dim["batch"]]))
        logits = build(mtf, mtf_mesh, inputs, dim)
        if "classes" not in [d.name for d in logits.shape.dims]:
            raise ValueError(f"The Mesh-TF model must return logits with a 'classes' dimension. "
                             f"Received: logits of shape {logits.shape}")
        loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(logits, labels, dim["classes"]))
        trainable = mesh_graph.trainable_variables
        grads = mtf.gradients([loss], [v.outputs[0] for v in trainable])
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh.layout.mtf_shape, mesh.layout.mtf_rules, mesh.devices)
        lowering = mtf.Lowering(mesh_graph, {mtf_mesh: impl}, autostack=False)  # keep one laid-out variable each
        tf_loss = lowering.export_to_tf_tensor(loss)
        tf_update = _sgd_update(lowering, trainable, grads, tf_loss, learning_rate)
        init = tf.compat.v1.global_variables_initializer()
        to_slices = lowering.copy_masters_to_slices()
        to_masters = lowering.copy_slices_to_masters()
        variables = mesh_graph.all_variables
        masters = [v.get_master() for v in variables]
        placement = count_devices(op.device for op in graph.get_operations() if op.device)
    session = tf.compat.v1.Session(graph=graph)
    session.run(init)
    session.run(to_slices)

    def step(xb: Any, yb: Any) -> float:
        return float(session.run([tf_loss, tf_update], feed_dict={x_ph: xb, y_ph: yb})[0])

    def finish() -> dict[str, Any]:
        with session:
            session.run(to_masters)
            trained = dict(zip([v.name for v in variables], session.run(masters)))
        return {"placement": placement, "weights": trained}

    return MeshRun(step, finish)


def _sgd_update(lowering: Any, trainable: list, grads: list, tf_loss: Any, learning_rate: float) -> Any:
    # SGD on the slice variables, after every gradient slice and the loss exist. Mesh-TF lowers
    # a variable read to the slice variables themselves, so each consumer reads them anew; with
    # mtf's own Assign ops nothing orders a backward-pass read of one variable before another
    # variable's update, and a step can see half-updated weights.
    import tensorflow as tf

    grad_slices = [lowering.tensors[g].to_laid_out_tensor().all_slices for g in grads]
    updates = []
    with tf.control_dependencies([t for slices in grad_slices for t in slices] + [tf_loss]):
        for var, slices in zip(trainable, grad_slices):
            for var_slice, grad_slice in zip(lowering.variables[var].laid_out_tensor.all_slices, slices):
                with tf.device(var_slice.device):
                    updates.append(var_slice.assign_sub(learning_rate * grad_slice))
    return tf.group(updates)


def _activation(mtf: Any, name: str, h: Any) -> Any:
    if name == "relu":
        return mtf.relu(h)
    if name == "tanh":
        return mtf.tanh(h)
    if name == "sigmoid":
        return mtf.sigmoid(h)
    return h


def _block(mtf: Any, x: Any, block: Any, dim: dict[str, Any], variable: Any) -> Any:
    # The function of TransformerBlock (Keras MultiHeadAttention as self-attention, then the
    # MLP, each with a residual), written with mtf.einsum so that Mesh-TF can split heads and
    # hidden units.
    attention = attention_parts(block.attention)
    batch, seq, d_model = dim["batch"], dim["seq"], dim["d_model"]
    heads, kv, memory = dim["heads"], dim["kv"], dim["memory_seq"]
    memory_x = mtf.rename_dimension(x, "seq", "memory_seq")
    projections = {}
    for name, dense, source, length in (("query", attention.query, x, seq),
                                        ("key", attention.key, memory_x, memory),
                                        ("value", attention.value, memory_x, memory)):
        w = variable(f"{name}_kernel", [d_model, heads, kv], dense.kernel)
        t = mtf.einsum([source, w], output_shape=[batch, length, heads, kv])
        if attention.use_bias:
            t = t + variable(f"{name}_bias", [heads, kv], dense.bias)
        projections[name] = t
    q = projections["query"] * (1.0 / math.sqrt(float(dim["kv"].size)))
    scores = mtf.einsum([q, projections["key"]], output_shape=[batch, heads, seq, memory])
    probs = mtf.softmax(scores, memory)
    context = mtf.einsum([probs, projections["value"]], output_shape=[batch, seq, heads, kv])
    wo = variable("output_kernel", [heads, kv, d_model], attention.output.kernel)
    out = mtf.einsum([context, wo], output_shape=[batch, seq, d_model])
    if attention.use_bias:
        out = out + variable("output_bias", [d_model], attention.output.bias)
    h = x + out
    w1 = variable("mlp_in_kernel", [d_model, dim["hidden"]], block.dense1.kernel)
    m = mtf.relu(mtf.einsum([h, w1], output_shape=[batch, seq, dim["hidden"]]) +
                 variable("mlp_in_bias", [dim["hidden"]], block.dense1.bias))
    w2 = variable("mlp_out_kernel", [dim["hidden"], d_model], block.dense2.kernel)
    m = mtf.einsum([m, w2], output_shape=[batch, seq, d_model]) + variable("mlp_out_bias", [d_model], block.dense2.bias)
    return h + m
