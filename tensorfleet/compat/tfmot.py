"""tensorflow-model-optimization (tfmot), imported without changing the process's choice of Keras.

tfmot 0.8 sets ``os.environ["TF_USE_LEGACY_KERAS"] = "1"`` as it is imported
(``tensorflow_model_optimization/python/core/keras/compat.py``, ``_get_keras_instance``, run once at import) so
that it takes tf_keras itself. That leaves the user's process saying it chose tf_keras: Keras Tuner imported
later through :func:`tensorfleet.compat.keras_tuner.import_keras_tuner` would then drive ``tf.keras`` of a
Keras 3 process, and every child started with this environment would run tf_keras. :func:`import_tfmot`
imports it and puts the variable back as it was; tfmot keeps using tf_keras (it chose its module already).
"""

from __future__ import annotations

import os
import sys
import threading
from types import ModuleType

__all__ = ["import_tfmot"]

_VARIABLE = "TF_USE_LEGACY_KERAS"
_LOCK = threading.Lock()


def import_tfmot() -> ModuleType:
    """``tensorflow_model_optimization``, with ``TF_USE_LEGACY_KERAS`` as it was before the import."""
    with _LOCK:
        if "tensorflow_model_optimization" in sys.modules:
            return sys.modules["tensorflow_model_optimization"]
        before = os.environ.get(_VARIABLE)
        try:
            import tensorflow_model_optimization as tfmot
        finally:
            if before is None:
                os.environ.pop(_VARIABLE, None)
            else:
                os.environ[_VARIABLE] = before
        return tfmot
