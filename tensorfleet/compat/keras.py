"""Keras as tensorfleet uses it: the Keras 2 API (tf_keras on TensorFlow >= 2.16, ``tf.keras`` before).

TensorFlow 2.16 and later serve Keras 3 as ``tf.keras`` unless ``TF_USE_LEGACY_KERAS=1`` was set
before ``tf.keras`` was first touched; ``import tensorfleet`` sets it (a value of the user's own
wins). Keras 3 models cannot run here: parameter-server ``fit`` has no ClusterCoordinator in Keras 3's
trainer, MultiWorkerMirrored ``fit`` is broken upstream, tfmot and TFF take only Keras 2 models. So
every entry point that takes a model calls :func:`require_keras2` first.

Example:
    >>> import tensorfleet.compat.keras as ck
    >>> ck.require_keras2(object(), "convert")
    Traceback (most recent call last):
    TypeError: convert takes a Keras model (tf.keras / tf_keras). Received: model of type object
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["Keras3ModelError", "is_keras3_model", "keras_flavour", "require_keras2"]

log = logging.getLogger(__name__)

_FIX = ("tensorfleet runs Keras 2 models (tf_keras, TensorFlow's `tf.keras` with TF_USE_LEGACY_KERAS=1). "
        "Build the model with `tf.keras` after `import tensorfleet` (which selects tf_keras), or with "
        "`import tf_keras as keras`; do not `import keras` (that is Keras 3), and do not set "
        "TF_USE_LEGACY_KERAS=0.")


class Keras3ModelError(TypeError):
    """A Keras 3 model was handed to an entry point that runs Keras 2 (tf_keras) models only."""


def keras_flavour() -> str:
    """Which Keras ``tf.keras`` is in this process: ``"tf_keras"``, ``"keras2"`` (TF < 2.16) or ``"keras3"``."""
    import tensorflow as tf

    module = type(tf.keras.Model).__module__ if hasattr(tf.keras, "Model") else ""
    name = getattr(tf.keras, "__name__", "")
    if name.startswith("tf_keras") or module.startswith("tf_keras"):
        return "tf_keras"
    version = getattr(tf.keras, "__version__", "3")
    return "keras2" if str(version).startswith("2.") else "keras3"


def is_keras3_model(model: Any) -> bool:
    """True when ``model`` is (or is part of) Keras 3: its class lives in the ``keras`` 3 package."""
    for cls in type(model).__mro__:
        root = cls.__module__.split(".")[0]
        if root == "keras":
            try:
                import keras
            except ImportError:  # pragma: no cover - a class from keras implies the package
                return False
            return str(getattr(keras, "__version__", "3")).split(".")[0] >= "3"
    return False


def require_keras2(model: Any, where: str) -> Any:
    """``model`` if it is a Keras 2 (tf_keras / TF < 2.16 ``tf.keras``) model; else one clear error.

    Args:
        model: what the user handed to ``where``.
        where: the entry point's name, for the message (``"tfl.edge.convert"``).

    Raises:
        Keras3ModelError: ``model`` is a Keras 3 model (the message names the fix).
        TypeError: ``model`` is not a Keras model at all.
    """
    if is_keras3_model(model):
        raise Keras3ModelError(f"{where} received a Keras 3 model ({type(model).__module__}."
                               f"{type(model).__qualname__}). {_FIX}")
    import tensorflow as tf

    if not isinstance(model, tf.keras.Model):
        raise TypeError(f"{where} takes a Keras model (tf.keras / tf_keras). "
                        f"Received: model of type {type(model).__qualname__}")
    return model


def legacy_keras_selected() -> bool:
    """Whether this process asked TensorFlow for tf_keras as ``tf.keras`` (``TF_USE_LEGACY_KERAS``)."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")
