"""ZeRO on a DTensor mesh: optimizer state, gradients and parameters split over the batch axis.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020.
With ``Mesh(..., zero=stage)``, each of the N data replicas (the devices along the ``batch`` rule's
mesh dimension) keeps 1/N of:

* stage 1, the optimizer state: every slot is split over the batch dimension
  (:func:`shard_optimizer_state`); DTensor gathers what each update reads.
* stage 2, also the gradients: the function that computes them relays each one out to its slot's
  layout (:func:`zero_layout`), so the sum over the replicas arrives reduce-scattered and each
  replica keeps and applies its 1/N; DTensor gathers the change into the weight, which stays whole
  over the batch dimension.
* stage 3, also the parameters: each trainable weight is stored split over the batch dimension
  (:class:`ZeroVariable`). Inside the trainer's forward pass (:func:`gathering`) a read relays it
  out to its layout of stage 0 (an all-gather over the replicas); the gradient is taken with
  respect to that gathered value, exactly as in stage 0 (an embedding's stays IndexedSlices, which
  Keras' ``clipnorm`` clips by the norm of its rows as gathered), clipped, and relaid out split, as
  in stage 2. (Taken with respect to the stored variable instead, DTensor's ``relayout_like``
  returns it split but dense, and clipping then differed from one device by up to 1.3e-4 in a
  step's embedding update.)

Each weight is split on its first axis that no mesh dimension splits yet and that the batch
dimension divides (:func:`zero_axis`); a weight without such an axis keeps its layout.
:func:`weight_splits` gives the same decisions weight by weight, for the planner
(:mod:`tensorfleet.planner.splits`).
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Iterator, Sequence

import tensorflow as tf
from tensorflow.experimental import dtensor

from tensorfleet.compat.tf_keras import optimizer_variables, replace_optimizer_variables
from tensorfleet.model_parallel.mesh.keras_layout import KerasLayout
from tensorfleet.model_parallel.partition import WeightSplit

__all__ = ["ZeroVariable", "gathering", "shard_optimizer_state", "weight_splits", "zero_axis", "zero_layout"]


def zero_axis(shape: Sequence[int], mesh_axes: Sequence[str | None], batch_axis: str | None, parts: int) -> int | None:
    """The axis ZeRO splits a weight of ``shape`` laid out as ``mesh_axes`` on over ``batch_axis``
    (of ``parts`` devices): the first one no mesh dimension splits that ``parts`` divides; ``None``
    when there is none, or the weight is split over ``batch_axis`` already.

    Example:
        >>> (zero_axis((16, 32), (None, "m"), "b", 2), zero_axis((32,), ("m",), "b", 2),
        ...  zero_axis((6, 4), (None, None), "b", 4))
        (0, None, 1)
    """
    if batch_axis is None or batch_axis in mesh_axes:
        return None
    return next((axis for axis, (mesh_dim, size) in enumerate(zip(mesh_axes, shape))
                 if mesh_dim is None and size % parts == 0), None)


def zero_layout(layout: Any, shape: Sequence[int], batch_axis: str | None) -> Any:
    """``layout`` (a ``dtensor.Layout`` of a tensor of ``shape``) also split over ``batch_axis`` on
    its :func:`zero_axis`; ``layout`` itself when there is none."""
    if batch_axis is None:
        return layout
    spec = list(layout.sharding_specs)
    axes = [None if s == dtensor.UNSHARDED else s for s in spec]
    axis = zero_axis(tuple(shape), axes, batch_axis, layout.mesh.dim_size(batch_axis))
    if axis is None:
        return layout
    spec[axis] = batch_axis
    return dtensor.Layout(spec, layout.mesh)


def shard_optimizer_state(optimizer: Any, batch_axis: str | None) -> int:
    """ZeRO stage 1: every built optimizer slot of rank >= 1 also split over the batch mesh
    dimension (:func:`zero_layout`). Returns how many slots were split."""
    if batch_axis is None:
        return 0
    replaced: dict[int, Any] = {}
    for slot in optimizer_variables(optimizer):
        if slot is optimizer.iterations or slot.shape.rank == 0 or not hasattr(slot, "layout"):
            continue
        layout = zero_layout(slot.layout, slot.shape, batch_axis)
        if layout is slot.layout:
            continue
        value = dtensor.relayout(slot.read_value(), layout)
        scope, _, name = slot.name.split(":")[0].rpartition("/")
        with tf.name_scope(scope + "/" if scope else ""):  # the slot keeps its name, e.g. "Adam/m/d1/kernel"
            replaced[id(slot)] = dtensor.DVariable(value, trainable=False, name=name)
    replace_optimizer_variables(optimizer, replaced)
    return len(replaced)


_STATE = threading.local()


@contextlib.contextmanager
def gathering() -> Iterator[dict[int, Any]]:
    """Inside, a :class:`ZeroVariable` read as a tensor is gathered to its layout of stage 0 (the
    trainer's forward passes trace under it), once per variable: the context's value maps
    ``id(variable)`` to that gathered tensor, so that gradients can be taken with respect to it.
    Outside, a ZeroVariable reads as stored."""
    previous = getattr(_STATE, "reads", None)
    _STATE.reads = {}
    try:
        yield _STATE.reads
    finally:
        _STATE.reads = previous


class ZeroVariable(dtensor.DVariable):
    """A weight stored split over the batch axis (ZeRO stage 3), read whole over it in :func:`gathering`.

    Args:
        initial_value: the weight's value, laid out as it is stored.
        compute_layout: the layout its reads are relaid out to inside :func:`gathering`.
    """

    def __init__(self, initial_value: Any, *, compute_layout: Any, **kwargs: Any) -> None:
        super().__init__(initial_value, **kwargs)
        self.compute_layout = compute_layout

    def value(self) -> Any:
        reads = getattr(_STATE, "reads", None)
        if reads is None:
            return super().value()
        if id(self) not in reads:
            reads[id(self)] = dtensor.relayout(super().value(), self.compute_layout)
        return reads[id(self)]

    def sparse_read(self, indices: Any, name: Any = None) -> Any:
        # An embedding lookup gathers from the variable's handle; TF 2.14's ResourceGather cannot
        # gather from a table split by rows, so the rows are gathered from the whole value (and the
        # gradient with respect to it stays IndexedSlices, as on one device).
        if getattr(_STATE, "reads", None) is not None:
            return tf.gather(self.value(), indices, name=name)
        return super().sparse_read(indices, name=name)


def weight_splits(model: Any, layout: KerasLayout) -> list[WeightSplit]:
    """Each weight of ``model`` as the mesh lays it out (built in the scope that filled
    ``layout``), as a :class:`~tensorfleet.model_parallel.partition.WeightSplit`: its elements,
    the parts its layout decision splits it into, and the parts ZeRO splits it into over the batch
    dimension (whatever stage the mesh runs: the planner's ``zero`` chooses). A weight the scope did
    not lay out is a ``ValueError``."""
    from tensorfleet.compat.keras import is_keras3_model

    decided = {w.path: w for w in layout.decided}
    batch = layout.batch_axis
    replicas = layout.mesh_dims[batch] if batch else 1
    splits = []
    for variable in model.weights:
        path = variable.path if is_keras3_model(model) else variable.name.split(":")[0]
        if path not in decided:
            raise ValueError(f"Weight {path!r} of model {model.name!r} was not laid out by this mesh; build the model "
                             f"inside mesh.scope(). Received: a model with weights the scope did not create")
        weight = decided[path]
        parts = math.prod(layout.mesh_dims[a] for a in weight.mesh_axes if a is not None)
        split = zero_axis(weight.shape, weight.mesh_axes, batch, replicas) is not None
        splits.append(WeightSplit(math.prod(weight.shape), parts=parts, zero_parts=replicas if split else 1,
                                  trainable=bool(variable.trainable)))
    return splits
