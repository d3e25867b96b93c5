"""The ``keras`` mesh backend: the Keras model rebuilt from tensor-parallel Keras layers.

The batch is split over the mesh dimension that ``batch`` maps to (data-parallel replicas) and
the MLP hidden units and attention heads over the mesh dimension that ``hidden`` / ``heads`` map
to (:mod:`tensorfleet.model_parallel.tensor_parallel`), each shard's weights on its device.
Weight shards are kept once and read by every data replica; the replicas' gradient
contributions are summed; the step is one ``tf.function``, whose graph keeps every shard's and
replica's device, for the backward pass as for the forward one (each gradient op runs where the
op it differentiates runs); the loop over batches and epochs is Keras' ``fit``
(:class:`~tensorfleet.model_parallel.mesh.step_trainer.StepTrainer`). Split layers are Megatron's:
the layout may split only ``batch``, ``hidden`` and ``heads``.
"""

from __future__ import annotations

from typing import Any

from tensorfleet.compat.keras import keras2
from tensorfleet.compat.tf_keras import attention_parts
from tensorfleet.model_parallel import tensor_parallel as tp
from tensorfleet.model_parallel.mesh.dimensions import MeshStep, mesh_steps
from tensorfleet.model_parallel.mesh.step_trainer import MeshRun
from tensorfleet.model_parallel.mesh.training import count_devices

__all__ = ["prepare"]

BACKEND = "keras"  # MeshBackend value: this module is named after it


def _mesh_grid(mesh: Any) -> tuple[list[list[str]], str | None]:
    """``mesh``'s devices as [data replica][model shard], and the mesh dimension used as the model axis."""
    layout, devices = mesh.layout, mesh.devices
    rules = layout.rules
    unsupported = sorted(set(rules) - {"batch", "hidden", "heads"})
    if unsupported:
        raise ValueError(f"The keras mesh backend splits only the batch, hidden and heads dimensions. Received: "
                         f"layout rule(s) for {', '.join(unsupported)} in layout={layout.layout!r}; use backend='mtf'")
    data_axis = rules.get("batch")
    model_axes = {rules[d] for d in ("hidden", "heads") if d in rules}
    if len(model_axes) > 1:
        raise ValueError(f"The keras mesh backend needs hidden and heads on the same mesh dimension. "
                         f"Received: layout={layout.layout!r}")
    model_axis = next(iter(model_axes), None)
    if model_axis is not None and model_axis == data_axis:
        raise ValueError(f"batch and the model dimensions must be on different mesh dimensions. "
                         f"Received: layout={layout.layout!r}")
    n_data = layout.mesh_dims[data_axis] if data_axis else 1
    n_model = layout.mesh_dims[model_axis] if model_axis else 1
    grid = [[""] * n_model for _ in range(n_data)]
    for pnum, device in enumerate(devices):
        coords = layout.coordinates(pnum)
        others = [c for name, c in coords.items() if name not in (data_axis, model_axis)]
        if any(others):
            continue  # mesh dimensions that no rule uses replicate; the first slice does the work
        grid[coords[data_axis] if data_axis else 0][coords[model_axis] if model_axis else 0] = device
    return grid, model_axis


def _parallel_chain(steps: list[MeshStep], rules: dict[str, str], model_axis: str | None,
                    shard_devices: list[str]) -> tuple[list[tuple[str, Any]], list[tuple[Any, Any]]]:
    """The executable chain, with tensor-parallel stand-ins where the layout splits something,
    and the (stand-in, original layers) pairs whose weights go back when training ends."""
    chain: list[tuple[str, Any]] = []
    write_back: list[tuple[Any, Any]] = []
    i = 0
    while i < len(steps):
        step = steps[i]
        split_hidden = "hidden" in rules and model_axis is not None
        if (step.kind == "dense" and step.out_dim == "hidden" and split_hidden and i + 1 < len(steps)
                and steps[i + 1].kind == "dense"):
            second = steps[i + 1].layer
            if second.activation.__name__ != "linear":
                raise ValueError(f"A split MLP's second Dense is row-parallel and must be linear in the keras backend. "
                                 f"Received: layer {second.name!r} with activation {second.activation.__name__!r}")
            mlp = tp.ParallelMLP.from_dense(step.layer, second, devices=shard_devices)
            chain.append(("parallel", mlp))
            write_back.append((mlp, (step.layer, second)))
            i += 2
            continue
        if step.kind == "block" and model_axis is not None and ("hidden" in rules or "heads" in rules):
            block = tp.ParallelTransformerBlock.from_block(
                step.layer, devices=shard_devices if "hidden" in rules else shard_devices[:1],
                heads_devices=shard_devices if "heads" in rules else shard_devices[:1])
            chain.append(("parallel", block))
            write_back.append((block, step.layer))
        else:
            chain.append(("plain", step.layer))
        i += 1
    return chain, write_back


def prepare(mesh: Any, model: Any, dims: dict[str, int], *, x_shape: tuple[int, ...],
            learning_rate: float) -> MeshRun:
    """``model`` with tensor-parallel stand-ins over ``mesh``'s grid, ready to train one step at a time
    (:class:`~.step_trainer.StepTrainer`); its ``finish`` writes the weights back."""
    import tensorflow as tf

    grid, model_axis = _mesh_grid(mesh)
    chain, write_back = _parallel_chain(mesh_steps(model), mesh.layout.rules, model_axis, grid[0])
    variables = [v for kind, layer in chain for v in layer.trainable_variables]
    optimizer = keras2().optimizers.SGD(learning_rate)
    loss_fn = keras2().losses.SparseCategoricalCrossentropy(from_logits=True)

    def forward(xb: Any, row: list[str]) -> Any:
        h = xb
        for kind, layer in chain:
            if kind == "parallel":
                with tp.compute_on(row[: len(layer.devices)]):
                    h = layer(h)
            else:
                with tf.device(row[0]):
                    h = layer(h)
        return h

    n = x_shape[0]
    bounds = [round(r * n / len(grid)) for r in range(len(grid) + 1)]

    @tf.function
    def train_step(xb: Any, yb: Any) -> Any:
        # Traced once: the device placements of every shard and replica are kept in the graph.
        parts = []
        for r, row in enumerate(grid):
            a, b = bounds[r], bounds[r + 1]
            with tf.device(row[0]):
                logits = forward(xb[a:b], row)
                parts.append(loss_fn(yb[a:b], logits) * ((b - a) / n))
        with tf.device(grid[0][0]):
            loss = tf.add_n(parts)
        # Not a GradientTape: a tape builds the backward pass under the device scope of its
        # gradient() call, which put every gradient op on the first device. tf.gradients (in a
        # tf.function) colocates each gradient op with the forward op it differentiates, so the
        # backward pass of a shard runs on the shard's device, and a replica's on its row.
        optimizer.apply_gradients(zip(tf.gradients(loss, variables), variables))
        return loss

    signature = (tf.TensorSpec(x_shape, tf.float32), tf.TensorSpec((n,), tf.int32))

    def finish() -> dict[str, Any]:
        _write_back(write_back)
        graph = train_step.get_concrete_function(*signature).graph
        return {"placement": count_devices(op.device for op in graph.get_operations() if op.device), "grid": grid}

    return MeshRun(lambda xb, yb: float(train_step(tf.constant(xb, tf.float32), tf.constant(yb, tf.int32))), finish)


def _write_back(pairs: list[tuple[Any, Any]]) -> None:
    import numpy as np

    def mlp_back(mlp: Any, first: Any, second: Any) -> None:
        first.kernel.assign(np.concatenate([k.numpy() for k in mlp.column.kernels], axis=1))
        if first.use_bias:
            first.bias.assign(np.concatenate([b.numpy() for b in mlp.column.biases]))
        second.kernel.assign(np.concatenate([k.numpy() for k in mlp.row.kernels], axis=0))
        if second.use_bias:
            second.bias.assign(mlp.row.bias.numpy())

    for parallel, original in pairs:
        if isinstance(parallel, tp.ParallelMLP):
            mlp_back(parallel, *original)
            continue
        mlp_back(parallel.mlp, original.dense1, original.dense2)
        attention, source = parallel.attention, attention_parts(original.attention)
        for name, dense in source.projections.items():
            dense.kernel.assign(np.concatenate([s[f"{name}_kernel"].numpy() for s in attention.shards], axis=1))
            if attention.use_bias:
                dense.bias.assign(np.concatenate([s[f"{name}_bias"].numpy() for s in attention.shards], axis=0))
        source.output.kernel.assign(np.concatenate([s["output_kernel"].numpy() for s in attention.shards], axis=0))
        if attention.use_bias:
            source.output.bias.assign(attention.output_bias.numpy())
