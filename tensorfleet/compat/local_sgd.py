"""Local SGD's reach into Keras and ``tf.distribute``: the step without the gradient all-reduce, the collectives of
a traced function, and a multi-worker mirrored strategy over this process's devices.

- Keras 3 (3.15) all-reduces the gradients in the optimizer, ``TFOptimizer._all_reduce_sum_gradients`` (a sum
  of the replicas' gradients of a loss Keras scaled by ``1 / num_replicas_in_sync``); tf_keras (2.21) in
  ``Optimizer.aggregate_gradients``. :func:`local_gradients` replaces that method on one optimizer while a
  step is traced: each replica's gradient is multiplied by ``num_replicas_in_sync`` instead, which is the
  gradient of its own batch's mean loss, and ``distribute.extended.update`` then applies it to that replica's
  copy of each variable only.
- :func:`next_local_batch` takes the next batch of a distributed iterator without the all-reduce by which the
  workers of a multi-worker job agree, at every step, whether each still has data (``DistributedIterator.
  get_next`` under partial-batch handling); every worker must then have as many batches.
- :func:`collectives` counts the collective ops a traced ``tf.function`` runs per call, through the functions
  it calls (``_list_all_concrete_functions``); :func:`keras_train_functions` finds the ``tf.function`` objects
  behind a Keras ``train_function`` (Keras 3 keeps its in the closure of a Python function).
- :func:`local_multi_worker_mirrored` is ``MultiWorkerMirroredStrategy._from_local_devices``: the collective
  strategy (its ops are the ``CollectiveReduceV2`` of a multi-worker job) over logical devices of one process.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Iterator

__all__ = ["collectives", "keras_train_functions", "local_gradients", "local_metrics", "local_multi_worker_mirrored",
           "next_local_batch"]

_COLLECTIVE_PREFIXES = ("Collective", "NcclAllReduce")
_CALLS = ("PartitionedCall", "StatefulPartitionedCall")
_CONTROL_FLOW = ("If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase")
_key_bases = itertools.count(1)


def _scaled(grads_and_vars: Any, replicas: int) -> list[tuple[Any, Any]]:
    return [(None if g is None else g * replicas, v) for g, v in grads_and_vars]


@contextlib.contextmanager
def local_gradients(optimizer: Any, replicas: int) -> Iterator[None]:
    """While in this context (a step being traced), ``optimizer`` applies each replica's own gradient
    (x ``replicas``, undoing the loss scaling) instead of the all-reduced sum."""
    name = "_all_reduce_sum_gradients" if hasattr(optimizer, "_all_reduce_sum_gradients") else "aggregate_gradients"
    if not hasattr(optimizer, name):
        raise TypeError(f"local SGD needs an optimizer of Keras 3 or of tf_keras's optimizer API (with {name}). "
                        f"Received: optimizer of type {type(optimizer).__module__}.{type(optimizer).__qualname__}")
    object.__setattr__(optimizer, name, lambda grads_and_vars: _scaled(grads_and_vars, replicas))
    try:
        yield
    finally:
        object.__delattr__(optimizer, name)


def _local_metrics_result(model: Any) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for metric in model.metrics:
        result = type(metric).result(metric)  # the class's, without the instance's cross-replica result_wrapper
        results.update(result if isinstance(result, dict) else {metric.name: result})
    return results


@contextlib.contextmanager
def local_metrics(model: Any) -> Iterator[None]:
    """While in this context, a tf_keras model's step reports this replica's metrics: tf_keras wraps each
    metric's ``result`` so that, under a strategy that needs no merge call (multi-worker mirrored), it
    all-reduces the metric's variables at every step (measured: 4 collectives a step for loss + accuracy).
    Keras 3 reads them locally in a replica already; its model is left as it is."""
    if not hasattr(model, "get_metrics_result") or type(model).__module__.startswith("keras."):
        yield
        return
    object.__setattr__(model, "get_metrics_result", lambda: _local_metrics_result(model))
    try:
        yield
    finally:
        object.__delattr__(model, "get_metrics_result")


def next_local_batch(iterator: Any) -> Any:
    """The next batch of a ``tf.distribute`` iterator, each replica's part from this worker's own iterator
    (``_get_next_no_partial_batch_handling``): no collective. Raises ``OutOfRangeError`` at the end."""
    return iterator._get_next_no_partial_batch_handling()


def _function_collectives(name: str, library: dict[str, Any], seen: dict[str, int]) -> int:
    if name not in seen:
        seen[name] = 0  # a recursive call counts once
        seen[name] = _nodes_collectives(library[name].node_def, library, seen)
    return seen[name]


def _nodes_collectives(nodes: Any, library: dict[str, Any], seen: dict[str, int]) -> int:
    count = 0
    for node in nodes:
        if node.op.startswith(_COLLECTIVE_PREFIXES):
            count += 1
        elif node.op in library:
            count += _function_collectives(node.op, library, seen)
        elif node.op in _CALLS:
            count += _function_collectives(node.attr["f"].func.name, library, seen)
        elif node.op in _CONTROL_FLOW:
            branches = [a.func.name for a in node.attr.values() if a.func.name]
            branches += [f.name for a in node.attr.values() for f in a.list.func]
            if any(_function_collectives(b, library, seen) for b in branches):
                raise ValueError(f"{node.name} ({node.op}) runs collectives conditionally or in a loop: how many run "
                                 "per call is not in the graph.")
    return count


def collectives(function: Any) -> int:
    """The collective ops (all-reduces, gathers, broadcasts; one per local device) one call of a traced
    ``tf.function`` runs. Every trace must agree; a function not traced yet has 0.

    Raises:
        ValueError: a collective inside a ``tf.cond`` or loop, or traces that disagree.
    """
    counts = set()
    for concrete in function._list_all_concrete_functions():
        graph_def = concrete.graph.as_graph_def()
        library = {f.signature.name: f for f in graph_def.library.function}
        counts.add(_nodes_collectives(graph_def.node, library, {}))
    if len(counts) > 1:
        raise ValueError(f"the traces of {function} run different numbers of collectives: {sorted(counts)}")
    return counts.pop() if counts else 0


def keras_train_functions(train_function: Any) -> list[Any]:
    """The ``tf.function`` objects a Keras ``train_function`` runs: tf_keras's is one; Keras 3's is a Python
    function with one in its closure (``multi_step_on_iterator``)."""
    if hasattr(train_function, "_list_all_concrete_functions"):
        return [train_function]
    cells = getattr(train_function, "__closure__", None) or ()
    found = [c.cell_contents for c in cells if hasattr(c.cell_contents, "_list_all_concrete_functions")]
    if not found:
        raise TypeError(f"no tf.function behind the train function {train_function!r} (run_eagerly=True?)")
    return found


def local_multi_worker_mirrored(devices: list[str]) -> Any:
    """A ``MultiWorkerMirroredStrategy`` over ``devices`` of this process (no cluster): its all-reduces are the
    collective ops of a multi-worker job. Its collective keys start at a base of its own (set between
    ``__new__`` and ``__init__``, as :func:`tensorfleet.compat.distribute.new_mirrored_strategy` does), so
    several strategies can live in one process."""
    import tensorflow as tf
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver

    cls = tf.distribute.MultiWorkerMirroredStrategy
    strategy = cls.__new__(cls)
    strategy._collective_key_base = 7_000_000 + 100_000 * next(_key_bases)
    strategy.__init__()
    strategy.extended._initialize_local(TFConfigClusterResolver(), devices=devices)
    return strategy
