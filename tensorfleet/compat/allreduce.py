"""Where each Keras all-reduces the gradients under ``tf.distribute``, so another reduction can take its place.

Keras 3 (TensorFlow backend) sums the gradients over the replicas in the protected
``TFOptimizer._all_reduce_sum_gradients`` (``keras/src/backend/tensorflow/optimizer.py``), called in replica
context from ``apply``; tf_keras in ``Optimizer.aggregate_gradients`` (``tf_keras/src/optimizers/optimizer.py``),
called from ``apply_gradients``. :func:`install` wraps both (each only where this process uses that Keras): the
wrapper asks a lookup for the reducer attached to the optimizer's strategy and, when there is one, hands it the
replica context, the gradients and a key per variable; with none, Keras's own sum runs as before.

The wrappers are installed once per process and stay; a strategy without a reducer is untouched. tf_keras's
legacy optimizers (``tf_keras.optimizers.legacy``) aggregate elsewhere and are not wrapped:
:func:`covers` says whether an optimizer goes through a wrapped method.

Example (nothing is wrapped for an object that is no Keras optimizer):
    >>> covers(object())
    False
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable, Sequence

__all__ = ["Reducer", "covers", "install"]

log = logging.getLogger(__name__)

Reducer = Callable[[Any, Sequence[Any], Sequence[Any]], list[Any]]
"""``reducer(replica_context, gradients, keys) -> summed gradients``, one per gradient, in order."""

_lookup: list[Callable[[Any], Reducer | None]] = []
_wrapped: dict[str, Any] = {}


def _reduce_pairs(optimizer: Any, pairs: Any, original: Callable[[Any, Any], Any]) -> Any:
    import tensorflow as tf

    reducer = _lookup[0](getattr(optimizer, "_distribution_strategy", None)) if _lookup else None
    context = tf.distribute.get_replica_context()
    if reducer is None or context is None:
        return original(optimizer, pairs)
    pairs = list(pairs)
    present = [(g, v) for g, v in pairs if g is not None]
    if not present:
        return original(optimizer, pairs)
    grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g, _ in present]
    keys = [optimizer._var_key(v) for _, v in present]
    reduced = iter(reducer(context, grads, keys))
    return [(None, v) if g is None else (next(reduced), v) for g, v in pairs]


# Each Keras: the module, the class and the method that sums the gradients over the replicas.
_SITES = {"keras3": ("keras.src.backend.tensorflow.optimizer", "TFOptimizer", "_all_reduce_sum_gradients"),
          "tf_keras": ("tf_keras.src.optimizers.optimizer", "Optimizer", "aggregate_gradients")}


def _wrap(name: str) -> None:
    import importlib

    module, class_name, method = _SITES[name]
    cls = getattr(importlib.import_module(module), class_name)
    original = getattr(cls, method)

    @functools.wraps(original)
    def all_reduce(self: Any, grads_and_vars: Any) -> Any:
        return _reduce_pairs(self, grads_and_vars, original)

    setattr(cls, method, all_reduce)
    _wrapped[name] = cls


def install(lookup: Callable[[Any], Reducer | None]) -> None:
    """Routes each Keras's gradient all-reduce through ``lookup(strategy)``'s reducer (None: Keras's own sum).

    Wraps Keras 3's optimizer where the process uses Keras 3 (imported, or what ``tf.keras`` is), tf_keras's where
    it uses tf_keras; a Keras the process does not use is never imported. Idempotent; the latest ``lookup`` wins.
    """
    from tensorfleet.compat.keras import Keras, user_keras

    _lookup[:] = [lookup]
    wanted = {"keras3": "keras" in sys.modules or user_keras() is Keras.KERAS3,
              "tf_keras": "tf_keras" in sys.modules or user_keras() is Keras.KERAS2}
    for name in _SITES:
        if wanted[name] and name not in _wrapped:
            try:
                _wrap(name)
            except (ImportError, AttributeError) as exc:  # another Keras layout: the reducer would never run
                log.warning("Cannot route %s's gradient all-reduce (%s): its gradients are summed as before.",
                            name, exc)


def covers(optimizer: Any) -> bool:
    """Whether ``optimizer``'s gradients go through a wrapped all-reduce (tf_keras's legacy optimizers do not)."""
    return any(isinstance(optimizer, cls) for cls in _wrapped.values())
