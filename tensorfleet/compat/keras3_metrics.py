"""Keras 3's metrics under ``CentralStorageStrategy``: the mend that makes them what one device logs.

Under ``tf.distribute.experimental.CentralStorageStrategy`` a Keras 3 model trains to the same weights as
on one device, but ``fit`` and ``evaluate`` log other metrics (on a small MLP, 2 epochs: train accuracy
0.1014 against 0.5862 in the first epoch, evaluate accuracy 0.9144 against 0.9109). The class of Keras 3
bug is keras-team/keras#19280 and #19891. Where it comes from (Keras 3.15.1, TensorFlow 2.21):

* A Keras 3 metric keeps its state in variables with ``synchronization="on_read"`` and
  ``aggregation="sum"`` (``Metric.add_variable``); ``Mean`` adds to ``total`` and ``count`` with
  ``assign_add``.
* Keras 3's ``Variable.assign_add(value)`` is ``assign(self + value)`` (``keras/src/backend/common/
  variables.py``): a read, then a write of the whole new value.
* ``CentralStorageStrategy`` keeps one copy of each variable, wrapped in an ``AggregatingVariable``; an
  ``assign`` in a replica context sums what every replica assigns (the variable's ``SUM`` aggregation).
  Every replica assigns ``old + its own part``, so with R replicas the state becomes
  ``R * old + sum of parts``: every step multiplies what came before by R. ``total / count`` then weighs
  the first batches most (the first epoch's accuracy reads 0.10, what the untrained model scored).

tf_keras counts with ``tf.Variable.assign_add`` (one op: ``old + sum of parts``), which is why the same
script in tf_keras logs one device's metrics. The mend gives Keras 3's TensorFlow ``Variable`` that same
``assign_add``/``assign_sub`` where the bug lives, and nowhere else: a ``SUM``-aggregated variable whose
TensorFlow value is an ``AggregatingVariable`` (a central-storage, or multi-device parameter-server,
variable) adds with the ``AggregatingVariable``'s own ``assign_add``, which sums the replicas' parts and
adds them once. Every other variable (mirrored, one device, model weights, optimizer slots) keeps Keras'
own path. Measured with the mend (Keras 3.15.1, 2 logical CPUs): fit's accuracy and loss per epoch and
evaluate's metrics equal one device's within float32 tolerance.

:func:`mend_central_storage_metrics` installs it (idempotent); :func:`restore_central_storage_metrics`
takes it out. Nothing is installed at import, and a process that never imports Keras 3 is left as it is.

Example:
    >>> from tensorfleet.compat import keras3_metrics
    >>> keras3_metrics.UPSTREAM_ISSUES
    ('keras-team/keras#19280', 'keras-team/keras#19891')
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

__all__ = ["UPSTREAM_ISSUES", "central_storage_metrics_mended", "mend_central_storage_metrics",
           "restore_central_storage_metrics"]

log = logging.getLogger(__name__)

UPSTREAM_ISSUES = ("keras-team/keras#19280", "keras-team/keras#19891")
"""The upstream issues of Keras 3's distributed metric reductions."""

_originals: dict[str, Any] = {}
"""Keras' own ``assign_add``/``assign_sub`` of its TensorFlow ``Variable`` (``None``: inherited), while mended."""


def _variable_class() -> type:
    import keras

    return keras.Variable  # the TensorFlow backend's Variable (keras/src/backend/tensorflow/core.py)


def _aggregating_sum(variable: Any) -> bool:
    """Whether ``variable`` (a Keras 3 variable) sums what replicas assign to one central copy."""
    from tensorflow.python.distribute.ps_values import AggregatingVariable

    return getattr(variable, "aggregation", None) == "sum" and isinstance(getattr(variable, "_value", None),
                                                                       AggregatingVariable)


def _mended(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: Any, value: Any) -> Any:
        from keras.src.backend.common.stateless_scope import in_stateless_scope

        if in_stateless_scope() or not _aggregating_sum(self):
            return original(self, value)
        import tensorflow as tf

        # One add of the replicas' summed parts, as tf_keras does (keras-team/keras#19280, #19891).
        value = self._convert_to_tensor(value, dtype=self._dtype)
        return getattr(self._value, name)(tf.cast(value, self._value.dtype))

    method.tensorfleet_mend = True  # type: ignore[attr-defined]
    return method


def central_storage_metrics_mended() -> bool:
    """Whether :func:`mend_central_storage_metrics` is installed in this process."""
    return bool(_originals)


def mend_central_storage_metrics() -> bool:
    """Makes Keras 3's metrics under ``CentralStorageStrategy`` count as one device does (see the module).

    Idempotent. Nothing is done (False) where this process does not use Keras 3 on the TensorFlow backend:
    the ``keras`` package is not Keras 3, or neither imported nor what ``tf.keras`` is.

    Returns:
        True when the mend is installed (now or before).
    """
    if _originals:
        return True
    if not _keras3_in_use():
        return False
    variable = _variable_class()
    for name in ("assign_add", "assign_sub"):
        _originals[name] = variable.__dict__.get(name)
        setattr(variable, name, _mended(name, getattr(variable, name)))
    log.info("Mended Keras 3's metric variables under CentralStorageStrategy (%s).", ", ".join(UPSTREAM_ISSUES))
    return True


def restore_central_storage_metrics() -> None:
    """Puts Keras 3's own ``assign_add``/``assign_sub`` back (a no-op when nothing was mended)."""
    if not _originals:
        return
    variable = _variable_class()
    for name, original in list(_originals.items()):
        if original is None:
            delattr(variable, name)
        else:
            setattr(variable, name, original)
        del _originals[name]


def _keras3_in_use() -> bool:
    from tensorfleet.compat.keras3 import keras3_in_use  # the one rule of both modules

    return keras3_in_use() is not None
