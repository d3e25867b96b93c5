"""Which Keras: the user's, as it is. tensorfleet never chooses for the process.

Two Kerases live beside TensorFlow >= 2.16: Keras 3 (the ``keras`` package, what ``tf.keras`` is
unless ``TF_USE_LEGACY_KERAS=1`` was set before TensorFlow first touched Keras) and tf_keras (the
Keras 2 API). On TensorFlow < 2.16 (the tff track) ``tf.keras`` is Keras 2 itself. Importing
tensorfleet changes neither ``TF_USE_LEGACY_KERAS`` nor what ``tf.keras`` is: each entry point looks
at what it receives (:func:`keras_of` a model, :func:`saved_keras` of a ``.keras`` file) and runs it
with that Keras; a model tensorfleet builds itself (:func:`keras_module` with no choice) is built in
the Keras ``tf.keras`` is in the caller's process.

A room that still runs Keras 2 models only (federated, edge, the mesh) calls :func:`require_keras2`,
whose error says which Keras the room needs and how to get it; a room uses :func:`keras2` (never
``tf.keras``) for what it builds itself.

Example:
    >>> import tensorfleet.compat.keras as ck
    >>> ck.require_keras2(object(), "convert")
    Traceback (most recent call last):
    TypeError: convert takes a Keras model (Keras 3 or tf_keras). Received: model of type object
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
from types import ModuleType
from typing import Any, Iterator

__all__ = ["KERAS2_HOWTO", "Keras", "Keras3ModelError", "KerasFileError", "as_keras", "is_keras3_model", "keras2",
           "keras3", "keras_flavour", "keras_major", "keras_module", "keras_of", "legacy_keras_selected", "load_model",
           "model_variables", "module_of", "seeded", "sublayers", "require_keras2", "require_keras2_layer",
           "saved_keras", "set_random_seed", "tf_variable",
           "user_keras"]

log = logging.getLogger(__name__)


class Keras(str, enum.Enum):
    """The two Kerases a model can be written in, as the API, the CLI and config files name them."""

    KERAS2 = "keras2"
    """tf_keras on TensorFlow >= 2.16 (``import tf_keras``), ``tf.keras`` on TensorFlow < 2.16."""
    KERAS3 = "keras3"
    """The ``keras`` package 3.x: ``import keras``, and ``tf.keras`` on TensorFlow >= 2.16 by default."""


_ALIASES = {"keras2": Keras.KERAS2, "tf_keras": Keras.KERAS2, "2": Keras.KERAS2,
            "keras3": Keras.KERAS3, "keras": Keras.KERAS3, "3": Keras.KERAS3}

KERAS2_HOWTO = ("For Keras 2, build the model with `import tf_keras as keras` (or set TF_USE_LEGACY_KERAS=1 "
                "before TensorFlow starts, so that `tf.keras` is tf_keras).")


class Keras3ModelError(TypeError):
    """A Keras 3 model was handed to an entry point that runs Keras 2 (tf_keras) models only."""


class KerasFileError(ValueError):
    """A saved Keras model (``.keras`` / ``.h5``) cannot be read: damaged, or of a Keras not installed here."""


def keras_major(package: str) -> int:
    """The major version of the installed Keras ``package`` (``keras``, ``tf_keras``); 3 when it cannot be read."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version(package).split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 3


def _tf_before_216() -> bool:
    import tensorflow as tf

    major, minor = (int(part) for part in tf.__version__.split(".")[:2])
    return (major, minor) < (2, 16)


def keras_flavour() -> str:
    """Which Keras ``tf.keras`` is in this process: ``"tf_keras"``, ``"keras2"`` (TF < 2.16) or ``"keras3"``."""
    import tensorflow as tf

    root = tf.keras.Model.__module__.split(".")[0]
    if root == "tf_keras":
        return "tf_keras"
    return "keras2" if keras_major(root) == 2 else "keras3"


def user_keras() -> Keras:
    """The Keras of the caller's process: what ``tf.keras`` is there (never changed by tensorfleet)."""
    return Keras.KERAS3 if keras_flavour() == "keras3" else Keras.KERAS2


def as_keras(which: Keras | str | Any, where: str = "keras=") -> Keras:
    """``which`` as a :class:`Keras`: a name (``"keras2"``/``"tf_keras"``/``"2"``, ``"keras3"``/``"keras"``/``"3"``),
    a Keras object (a model, layer, optimizer ...: its own Keras), or ``None`` (:func:`user_keras`).

    Raises:
        ValueError: another string (the message lists the accepted ones).
        TypeError: an object that is no Keras object.
    """
    if which is None:
        return user_keras()
    if isinstance(which, Keras):
        return which
    if not isinstance(which, str):
        return keras_of(which, where)
    key = str(which).strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"keras must be one of 'keras3', 'keras2' (also 'tf_keras'), or None for the Keras "
                         f"tf.keras is in this process. Received: keras={which!r}")
    return _ALIASES[key]


def keras2() -> ModuleType:
    """The Keras 2 API as a module: tf_keras on TensorFlow >= 2.16, ``tf.keras`` on TensorFlow < 2.16.

    Raises:
        ImportError: TensorFlow >= 2.16 without tf_keras installed (the message names the package).
    """
    import tensorflow as tf

    if _tf_before_216():
        return tf.keras
    try:
        import tf_keras
    except ImportError as error:
        raise ImportError(f"Keras 2 models need the tf_keras package beside TensorFlow {tf.__version__}: "
                          f"`pip install tf_keras=={tf.__version__}` ({error})") from None
    return tf_keras


def keras3() -> ModuleType:
    """The ``keras`` package at version 3 (Keras 3's TensorFlow backend).

    Raises:
        ImportError: Keras 3 is not installed here (the tff track's TensorFlow 2.14 has Keras 2.14).
    """
    import tensorflow as tf  # noqa: F401  (Keras 3 picks its backend from what is loaded)

    try:
        import keras
    except ImportError as error:
        raise ImportError(f"Keras 3 is not installed here ({error}): `pip install 'keras>=3'`") from None
    if not keras.__version__.startswith("3."):
        raise ImportError(f"Keras 3 is not installed here: keras is {keras.__version__} (TensorFlow < 2.16 "
                          "ships Keras 2). Use the current track (TensorFlow 2.21) for Keras 3 models.")
    return keras


def keras_module(which: Keras | str | None = None) -> ModuleType:
    """The Keras module for ``which`` (:func:`as_keras`): :func:`keras2` or :func:`keras3`."""
    return keras3() if as_keras(which) is Keras.KERAS3 else keras2()


def is_keras3_model(model: Any) -> bool:
    """True when ``model`` is a Keras 3 object: its class comes from the ``keras`` package at major version 3+."""
    roots = {cls.__module__.split(".")[0] for cls in type(model).__mro__}
    return "keras" in roots and "tf_keras" not in roots and keras_major("keras") >= 3


def keras_of(obj: Any, where: str = "tensorfleet", kind: str = "model") -> Keras:
    """Which Keras ``obj`` (a model, layer, optimizer, loss ...) belongs to, from its class.

    Raises:
        TypeError: ``obj`` is not a Keras object (the message names ``where`` and what was received).
    """
    roots = {cls.__module__.split(".")[0] for cls in type(obj).__mro__}
    if "tf_keras" in roots:
        return Keras.KERAS2
    if "keras" in roots:
        return Keras.KERAS3 if keras_major("keras") >= 3 else Keras.KERAS2
    raise TypeError(f"{where} takes a Keras {kind} (Keras 3 or tf_keras). Received: {kind} of type "
                    f"{type(obj).__qualname__}")


def module_of(obj: Any, where: str = "tensorfleet", kind: str = "model") -> ModuleType:
    """The Keras module ``obj`` belongs to (:func:`keras_of`): layers, optimizers and losses for it come from here."""
    return keras_module(keras_of(obj, where, kind))


def tf_variable(variable: Any) -> Any:
    """The ``tf.Variable`` that holds a Keras weight: Keras 3's TensorFlow backend wraps one in its own
    ``keras.Variable`` (its public ``value``, outside an autocast scope), Keras 2's weights are ``tf.Variable`` objects.

    Code that runs a model in its own compiled loops (assign, read, differentiate) works on these, for
    either Keras."""
    import tensorflow as tf

    if isinstance(variable, tf.Variable):
        return variable
    value = getattr(variable, "value", None)
    if isinstance(value, tf.Variable):
        return value
    raise TypeError(f"Expected a Keras weight backed by a tf.Variable (TensorFlow backend). Received: "
                    f"{type(variable).__qualname__}")


def model_variables(model: Any) -> tuple[list[Any], list[Any]]:
    """``(trainable, non-trainable)`` weights of a model of either Keras, as ``tf.Variable`` objects
    (:func:`tf_variable`).

    The weights only, in the order of ``trainable_weights`` and ``non_trainable_weights``: Keras 3 also
    counts its random seed generators' states among a model's ``non_trainable_variables``, which are no
    weights (they are not saved, sent or averaged)."""
    return ([tf_variable(v) for v in model.trainable_weights], [tf_variable(v) for v in model.non_trainable_weights])


def sublayers(model: Any) -> list[Any]:
    """``model`` and every layer inside it, nested models' and custom layers' included, in either Keras (their
    private ``_flatten_layers``: Keras 3 models have no ``submodules``, and ``layers`` lists the top level only)."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def set_random_seed(seed: int) -> None:
    """Seeds Python's ``random``, NumPy, TensorFlow and the global seed state of every Keras installed (Keras 3's
    global ``SeedGenerator``, tf_keras's seed generator), as ``keras.utils.set_random_seed`` does for its own Keras:
    the weights a model is built with, and the draws of its Dropout layers, follow from ``seed``."""
    import importlib.util

    keras2().utils.set_random_seed(seed)  # Python, NumPy, TensorFlow and tf_keras
    if not _tf_before_216() and importlib.util.find_spec("keras") is not None and keras_major("keras") >= 3:
        keras3().utils.set_random_seed(seed)


_MISSING = object()


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """:func:`set_random_seed` for the ``with`` block, and the process's random state as it was after it: Python's
    and NumPy's generators, TensorFlow's global seed and its op-seed sequence (its eager context's private
    ``_seed``/``_rng``), Keras 3's global seed and ``SeedGenerator``, tf_keras's seed generator. A library call
    that seeds its run (a federated simulation) leaves the user's other random draws where they were."""
    import random

    import numpy as np
    from tensorflow.python.eager import context

    ctx = context.context()
    saved_tf = (getattr(ctx, "_seed", None), getattr(ctx, "_rng", _MISSING))
    saved = (random.getstate(), np.random.get_state())
    keras2_generator = _tf_keras_seed_generator()
    saved_keras2 = getattr(keras2_generator, "generator", _MISSING) if keras2_generator is not None else _MISSING
    state = _keras3_global_state()
    saved_keras3 = ({k: state.get_global_attribute(k) for k in ("global_random_seed", "global_seed_generator")}
                    if state is not None else {})
    set_random_seed(seed)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        ctx._seed = saved_tf[0]
        if saved_tf[1] is _MISSING:
            if hasattr(ctx, "_rng"):
                del ctx._rng
        else:
            ctx._rng = saved_tf[1]
        if keras2_generator is not None:
            if saved_keras2 is _MISSING:
                keras2_generator.__dict__.pop("generator", None)
            else:
                keras2_generator.generator = saved_keras2
        for key, value in saved_keras3.items():
            state.set_global_attribute(key, value)


def _tf_keras_seed_generator() -> Any:
    """tf_keras's thread-local seed generator (``tf_keras.src.backend._SEED_GENERATOR``), or None."""
    import importlib.util

    if _tf_before_216() or importlib.util.find_spec("tf_keras") is None:
        return None
    from tf_keras.src import backend

    return getattr(backend, "_SEED_GENERATOR", None)


def _keras3_global_state() -> Any:
    """Keras 3's ``global_state`` module (its global seed and SeedGenerator), or None without Keras 3."""
    import importlib.util

    if _tf_before_216() or importlib.util.find_spec("keras") is None or keras_major("keras") < 3:
        return None
    from keras.src.backend.common import global_state

    return global_state


def require_keras2(model: Any, where: str) -> Any:
    """``model`` if it is a Keras 2 (tf_keras / TF < 2.16 ``tf.keras``) model; else one clear error.

    Args:
        model: what the user handed to ``where``.
        where: the entry point's name, for the message (``"tfl.edge.convert"``).

    Raises:
        Keras3ModelError: ``model`` is a Keras 3 model (the message says how to get Keras 2).
        TypeError: ``model`` is not a Keras model at all.
    """
    return _require_keras2(model, where, "model", "Model")


def _require_keras2(obj: Any, where: str, kind: str, class_name: str) -> Any:
    if is_keras3_model(obj):
        raise Keras3ModelError(f"{where} runs Keras 2 (tf_keras) {kind}s only for now, and received a Keras 3 "
                               f"{kind} ({type(obj).__module__}.{type(obj).__qualname__}). {KERAS2_HOWTO}")
    keras_of(obj, where, kind)
    keras2_class = getattr(keras2().layers if class_name == "Layer" else keras2(), class_name)
    if not isinstance(obj, keras2_class):
        raise TypeError(f"{where} takes a Keras {kind} (Keras 3 or tf_keras). Received: {kind} of type "
                        f"{type(obj).__qualname__}")
    return obj


def require_keras2_layer(layer: Any, where: str) -> Any:
    """``layer`` if it is a Keras 2 (tf_keras / TF < 2.16 ``tf.keras``) layer; else one clear error, as
    :func:`require_keras2` gives for models (for entry points that take a layer, such as tensor-parallel copies).

    Raises:
        Keras3ModelError: ``layer`` is a Keras 3 layer (the message names the fix).
        TypeError: ``layer`` is not a Keras layer at all.
    """
    return _require_keras2(layer, where, "layer", "Layer")


def legacy_keras_selected() -> bool:
    """Whether this process asked TensorFlow for tf_keras as ``tf.keras`` (``TF_USE_LEGACY_KERAS``), as a user
    who wants Keras 2 does; tensorfleet never sets it."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")


# Saved model files: which Keras wrote one, and loading it with that Keras (tensorfleet.compat.keras_files).
from tensorfleet.compat.keras_files import load_model, saved_keras  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------
# Serving: the names of a model's inputs and outputs, for Keras 2 and Keras 3 alike.

__all__ += ["producing_layer_name"]


def producing_layer_name(tensor: Any) -> str:
    """The name of the layer that made symbolic ``tensor`` (an input or output of a functional or Sequential
    model), in either Keras: Keras 3 keeps it in ``_keras_history.operation``, Keras 2 in ``_keras_history.layer``.
    ``tf_keras``' ``model.input_names`` are these names; a Keras 3 model has no ``input_names``."""
    history = tensor._keras_history
    return str((getattr(history, "operation", None) or history.layer).name)
