"""Batches for a model on a DTensor mesh, either Keras: arrays (or a ``dtensor.DTensorDataset``) as the
``DTensorDataset`` that ``fit``, ``evaluate`` and validation read, the batch split over the mesh
dimension of the ``batch`` rule (measured: Keras' loops over arrays or a plain ``tf.data.Dataset``
fail on a mesh, "Could not find ``tf._element_layouts``"; see :mod:`.keras_layout`)."""

from __future__ import annotations

import math
from typing import Any

from tensorfleet.model_parallel.mesh.keras_layout import KerasLayout
from tensorfleet.validation import number, positive_int

__all__ = ["batch_layout", "held_out", "mesh_dataset", "validation_pair"]


def batch_layout(layout: KerasLayout, dmesh: Any, rank: int) -> Any:
    """A batch's layout: split over the ``batch`` rule's mesh dimension, or whole without one."""
    from tensorflow.experimental import dtensor

    axis = layout.batch_axis
    return dtensor.Layout.batch_sharded(dmesh, axis, rank) if axis else dtensor.Layout.replicated(dmesh, rank)


def mesh_dataset(layout: KerasLayout, dmesh: Any, x: Any, y: Any, batch_size: Any, shuffle: bool,
                 names: str = "x and y") -> tuple[Any, int | None]:
    """``(dataset, full batches per pass)`` of arrays ``x, y`` on the mesh; a ``DTensorDataset`` ``x`` is
    returned as it is, with ``None`` batches (its steps are the caller's to give)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    if isinstance(x, dtensor.DTensorDataset):
        return x, None
    if y is None:
        raise ValueError(f"A mesh trains on arrays {names} (or a dtensor.DTensorDataset with steps). "
                         f"Received: {names.split()[0]} of type {type(x).__name__} and no labels")
    x, y = np.asarray(x), np.asarray(y)
    batch_size = positive_int("batch_size", 32 if batch_size is None else batch_size)
    axis = layout.batch_axis
    parts = layout.mesh_dims[axis] if axis else 1
    if batch_size % parts:
        raise ValueError(f"batch_size must be a multiple of mesh dimension {axis!r} of size {parts}, over "
                         f"which the batch is split. Received: batch_size={batch_size}")
    if len(x) != len(y) or len(x) < batch_size:
        raise ValueError(f"{names} must hold the same number of examples, at least batch_size ({batch_size}). "
                         f"Received: {len(x)} and {len(y)}")
    data = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        # One seed for every copy of the pipeline: DTensorDataset iterates it once per device, and the devices
        # that split one replica's model must read the same examples (an unseeded shuffle gave each its own
        # order: the shards then combined partial sums of different examples, and fit trained to 45%).
        # Drawn from TensorFlow's global seed, so that set_random_seed still decides the order.
        seed = int(tf.random.uniform((), maxval=2**31 - 1, dtype=tf.int64))
        data = data.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    # Every pass the same number of full batches, repeated: Keras keeps one iterator over a dataset
    # of unknown length for all epochs (and its validation), and one that ran out after the first
    # epoch poisoned DTensor's executor (CancelledError in the next epoch or in validation).
    data = data.take(len(x) // batch_size * batch_size).repeat()
    # No tf.data autotuning: its model thread sleeps in doubling periods (up to a minute), and destroying
    # the iterator at the end of fit, evaluate or predict waited for it to wake (stalls of seconds to over
    # a minute were seen on a 2-core machine). The data are arrays in memory; there is nothing to tune.
    options = tf.data.Options()
    options.autotune.enabled = False
    data = data.with_options(options)
    local = _local_replicas(dmesh, axis)
    if local:  # a mesh across processes: this process's share of each batch (see _local_replicas)
        per = batch_size // parts
        data = data.batch(batch_size, drop_remainder=True).flat_map(
            lambda xb, yb: tf.data.Dataset.from_tensor_slices(
                (tf.stack([xb[r * per:(r + 1) * per] for r in local]),
                 tf.stack([yb[r * per:(r + 1) * per] for r in local]))))
    layouts = (batch_layout(layout, dmesh, x.ndim), batch_layout(layout, dmesh, y.ndim))
    if local == []:  # a replica spans processes: whole batches, laid out as the batch once read (_WholeBatches)
        whole = (dtensor.Layout.replicated(dmesh, x.ndim), dtensor.Layout.replicated(dmesh, y.ndim))
        return _whole_batches_class()(data, mesh=dmesh, layouts=whole, global_batch_size=batch_size,
                                      relaid=layouts), len(x) // batch_size
    dataset = dtensor.DTensorDataset(data, mesh=dmesh, layouts=layouts, global_batch_size=batch_size, batch_dim=axis,
                                     dataset_already_batched=bool(local))
    return dataset, len(x) // batch_size


def _whole_batches_class() -> type:
    """A ``DTensorDataset`` that every device reads whole (replicated) batches of, relaid out as the batch (split
    over its mesh dimension) as each one is read: a slice on each device, no communication."""
    from tensorflow.experimental import dtensor

    class WholeBatches(dtensor.DTensorDataset):
        def __init__(self, *args: Any, relaid: tuple[Any, ...], **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.relaid = relaid

        def __iter__(self) -> Any:
            return _Relaid(super().__iter__(), self.relaid)

    return WholeBatches


class _Relaid:
    """An iterator of ``(x, y)`` DTensors, each relaid out to its layout of ``layouts`` as it is read."""

    def __init__(self, inner: Any, layouts: tuple[Any, ...]) -> None:
        self.inner, self.layouts = inner, layouts

    def __iter__(self) -> "_Relaid":
        return self

    def __next__(self) -> tuple[Any, ...]:
        from tensorflow.experimental import dtensor

        return tuple(dtensor.relayout(t, layout) for t, layout in zip(next(self.inner), self.layouts))


def _local_replicas(dmesh: Any, axis: str | None) -> list[int] | None:
    """On a mesh across processes with the batch split, the indices (along ``axis``) of the batch's parts this
    process's devices hold, in their order; else ``None``. DTensorDataset without tf.data service gives each
    process's first local part the dataset's first part of each batch (measured: both processes of a
    ``"b:2;m:2"`` mesh trained on the first half of every batch, weights 0.072 from one device), so each
    process is handed its own parts of every batch, already split. ``[]`` when a replica spans processes."""
    from tensorfleet.model_parallel.mesh.clients import is_multi_client

    if not axis or not is_multi_client():
        return None
    local = list(dict.fromkeys(location[axis] for location in dmesh.local_device_locations()))
    if dmesh.size // dmesh.dim_size(axis) > dmesh.num_local_devices() // len(local):
        # A replica spans processes ("m:2;b:2"): DTensorDataset gave every local replica the same part (0.072 off),
        # and without a batch dimension every device the batch's first part; so whole batches (_WholeBatches).
        return []
    return local


def validation_pair(validation_data: Any) -> tuple[Any, Any]:
    """``(x, y)`` of ``fit``'s ``validation_data``: a pair of arrays, or a DTensorDataset."""
    from tensorflow.experimental import dtensor

    if isinstance(validation_data, dtensor.DTensorDataset):
        return validation_data, None
    if isinstance(validation_data, (tuple, list)) and len(validation_data) == 2:
        return validation_data[0], validation_data[1]
    raise ValueError("validation_data on a mesh must be a pair (x_val, y_val) of arrays or a dtensor.DTensorDataset; "
                     "sample weights are not supported. Received: validation_data of type "
                     f"{type(validation_data).__name__}" + (f" with {len(validation_data)} items"
                                                             if isinstance(validation_data, (tuple, list)) else ""))


def held_out(x: Any, y: Any, validation_split: float) -> tuple[Any, Any, tuple[Any, Any]]:
    """The last ``validation_split`` of the examples held out, as Keras' own ``fit`` does."""
    import numpy as np
    from tensorflow.experimental import dtensor

    number("validation_split", validation_split, above=0.0, below=1.0)
    if isinstance(x, dtensor.DTensorDataset) or y is None:
        raise ValueError("validation_split needs arrays x and y to split; with a dtensor.DTensorDataset pass "
                         f"validation_data. Received: x of type {type(x).__name__}")
    x, y = np.asarray(x), np.asarray(y)
    cut = int(math.floor(len(x) * (1.0 - validation_split)))
    return x[:cut], y[:cut], (x[cut:], y[cut:])
