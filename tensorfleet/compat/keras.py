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

import enum
import json
import logging
import os
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["Keras", "Keras3ModelError", "KerasFileError", "is_keras3_model", "keras2", "keras3", "keras_flavour",
           "keras_module", "keras_of", "load_model", "module_of", "require_keras2", "saved_keras", "user_keras"]

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


def _keras_major(package: str) -> int:
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
    return "keras2" if _keras_major(root) == 2 else "keras3"


def user_keras() -> Keras:
    """The Keras of the caller's process: what ``tf.keras`` is there (never changed by tensorfleet)."""
    return Keras.KERAS3 if keras_flavour() == "keras3" else Keras.KERAS2


def as_keras(which: Keras | str | Any) -> Keras:
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
        return keras_of(which, "keras=", "object")
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
    return "keras" in roots and "tf_keras" not in roots and _keras_major("keras") >= 3


def keras_of(obj: Any, where: str = "tensorfleet", kind: str = "model") -> Keras:
    """Which Keras ``obj`` (a model, layer, optimizer, loss ...) belongs to, from its class.

    Raises:
        TypeError: ``obj`` is not a Keras object (the message names ``where`` and what was received).
    """
    roots = {cls.__module__.split(".")[0] for cls in type(obj).__mro__}
    if "tf_keras" in roots:
        return Keras.KERAS2
    if "keras" in roots:
        return Keras.KERAS3 if _keras_major("keras") >= 3 else Keras.KERAS2
    raise TypeError(f"{where} takes a Keras {kind} (Keras 3 or tf_keras). Received: {kind} of type "
                    f"{type(obj).__qualname__}")


def module_of(obj: Any, where: str = "tensorfleet", kind: str = "model") -> ModuleType:
    """The Keras module ``obj`` belongs to (:func:`keras_of`): layers, optimizers and losses for it come from here."""
    return keras_module(keras_of(obj, where, kind))


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


def legacy_keras_selected() -> bool:
    """Whether this process asked TensorFlow for tf_keras as ``tf.keras`` (``TF_USE_LEGACY_KERAS``), as a user
    who wants Keras 2 does; tensorfleet never sets it."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")


def saved_keras(path: str | os.PathLike[str]) -> Keras:
    """Which Keras wrote the saved model at ``path``: a ``.keras`` archive records it in ``metadata.json``
    (``keras_version``), an ``.h5`` file in its root attribute ``keras_version``.

    Raises:
        KerasFileError: ``path`` is not a readable ``.keras`` or ``.h5`` file, or records no version.
    """
    path = Path(path)
    version = _saved_version(path)
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        raise KerasFileError(f"{path} records keras_version {version!r}, which is not a version number") from None
    return Keras.KERAS3 if major >= 3 else Keras.KERAS2


def _saved_version(path: Path) -> str:
    if not path.is_file():
        raise KerasFileError(f"No Keras model file at {path} ({'a folder' if path.is_dir() else 'nothing there'}); "
                             "expected a .keras or .h5 file")
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                metadata = json.loads(archive.read("metadata.json"))
            return str(metadata["keras_version"])
        except (KeyError, ValueError, zipfile.BadZipFile, OSError) as error:
            raise KerasFileError(f"{path} is a zip archive but not a readable .keras model: its metadata.json "
                                 f"is missing or damaged ({type(error).__name__}: {error})") from None
    with open(path, "rb") as handle:
        head = handle.read(8)
    if head == b"\x89HDF\r\n\x1a\n":
        import h5py

        try:
            with h5py.File(path, "r") as h5:
                version = h5.attrs.get("keras_version")
        except OSError as error:
            raise KerasFileError(f"{path} is an HDF5 file that cannot be read ({error})") from None
        if version is None:
            raise KerasFileError(f"{path} is an HDF5 file without a Keras model (no keras_version attribute)")
        return version.decode() if isinstance(version, bytes) else str(version)
    raise KerasFileError(f"{path} is neither a .keras archive (zip) nor an .h5 model (HDF5): its first bytes are "
                         f"{head!r}")


def load_model(path: str | os.PathLike[str], *, compile: bool = True, where: str = "tensorfleet") -> Any:  # noqa: A002
    """The model saved at ``path``, loaded by the Keras that wrote it (:func:`saved_keras`).

    Raises:
        KerasFileError: the file is damaged, or its Keras is not installed here; the message names the file.
    """
    which = saved_keras(path)
    try:
        module = keras_module(which)
    except ImportError as error:
        raise KerasFileError(f"{where}: {path} was saved by {which.value}, which is not installed here: {error}") \
            from None
    try:
        return module.models.load_model(str(path), compile=compile)
    except Exception as error:  # any Keras deserialization failure is a problem with the file
        raise KerasFileError(f"{where}: {path} (saved by {which.value}) could not be loaded by "
                             f"{module.__name__} {module.__version__}: {type(error).__name__}: {error}") from None


# ---------------------------------------------------------------------------------------------------------------
# tf_keras internals that model parallelism needs (tensorfleet.model_parallel). tf_keras keeps them in
# ``tf_keras.src`` (TensorFlow >= 2.16), Keras 2.14 in ``keras.src``: :func:`keras_internal` decides which from
# the package ``tf.keras`` really is, so no caller names either.

__all__ += [
    "AttentionParts", "attention_parts", "build_call_context", "dropout_generator", "dropout_noise_shape",
    "inbound_layers", "is_graph_network", "keras_internal", "layout_map_scope", "learning_phase",
    "loss_function_wrapper", "optimizer_mesh", "optimizer_variables", "producing_layer",
    "replace_optimizer_variables", "require_keras2_layer", "smart_cond", "unfuse_normalization",
]


def require_keras2_layer(layer: Any, where: str) -> Any:
    """``layer`` if it is a Keras 2 (tf_keras / TF < 2.16 ``tf.keras``) layer; else one clear error, as
    :func:`require_keras2` gives for models (for entry points that take a layer, such as tensor-parallel copies).

    Raises:
        Keras3ModelError: ``layer`` is a Keras 3 layer (the message names the fix).
        TypeError: ``layer`` is not a Keras layer at all.
    """
    return _require_keras2(layer, where, "layer", "Layer")


def keras_internal(module: str) -> Any:
    """``<keras package>.src.<module>`` of the Keras 2 behind ``tf.keras``: ``tf_keras.src`` with tf_keras, ``keras.src``
    with Keras 2.14 (``keras.src`` on TensorFlow >= 2.16 is Keras 3, whose internals are another thing)."""
    import importlib

    root = keras2().layers.Layer.__module__.split(".")[0]
    return importlib.import_module(f"{root}.src.{module}")


def build_call_context() -> tuple[Any, Any]:
    """``(layer, inputs)`` of the Keras layer whose ``build``/``call`` is running, ``(None, None)`` outside one.

    A variable creator (``Mesh.scope()``) reads it to know which layer a new weight belongs to and the rank of
    what the layer reads; Keras keeps it in ``base_layer_utils.call_context()``, which is not public API.
    """
    context = keras_internal("engine.base_layer_utils").call_context()
    return context.layer, context.inputs


def layout_map_scope(layout_map: Any) -> Any:
    """Keras' own ``layout_map_scope``: inside it Keras creates its counters and loss containers on the
    ``LayoutMap``'s DTensor mesh (it has no public way in but ``Model`` construction under it)."""
    return keras_internal("dtensor.layout_map").layout_map_scope(layout_map)


def loss_function_wrapper(fn: Any) -> Any:
    """``fn`` (a loss function of ``(y_true, y_pred)``) as the ``tf.keras.losses.Loss`` Keras' ``compile`` wraps it in
    (``LossFunctionWrapper``: mean over the batch, sample weights), for a trainer that calls the loss itself."""
    return keras_internal("losses").LossFunctionWrapper(fn)


def learning_phase() -> Any:
    """Keras' global learning phase, which a layer's ``call`` reads when ``training`` is None."""
    return keras_internal("backend").learning_phase()


def smart_cond(pred: Any, true_fn: Any, false_fn: Any) -> Any:
    """Keras' ``smart_cond``: ``true_fn()`` or ``false_fn()`` chosen in Python when ``pred`` is known, a
    ``tf.cond`` when it is a tensor (what Keras' own Dropout does with ``training``)."""
    return keras_internal("utils.control_flow_util").smart_cond(pred, true_fn, false_fn)


class AttentionParts:
    """The parts of a built ``tf.keras.layers.MultiHeadAttention`` that it keeps private: its four
    ``EinsumDense`` projections and its sizes, read to copy, split or lay out its weights."""

    def __init__(self, attention: Any) -> None:
        self.query = attention._query_dense
        """EinsumDense ``(d_model) -> (heads, key_dim)``."""
        self.key = attention._key_dense
        self.value = attention._value_dense
        self.output = attention._output_dense
        """EinsumDense ``(heads, value_dim) -> (d_model)``."""
        self.use_bias = bool(attention._use_bias)
        self.num_heads = int(attention._num_heads)
        self.key_dim = int(attention._key_dim)

    @property
    def projections(self) -> dict[str, Any]:
        """``{"query": ..., "key": ..., "value": ...}``, in that order."""
        return {"query": self.query, "key": self.key, "value": self.value}


def attention_parts(attention: Any) -> AttentionParts:
    """The private parts of a built ``MultiHeadAttention`` (:class:`AttentionParts`)."""
    if getattr(attention, "built", False) is not True or getattr(attention, "_query_dense", None) is None:
        raise ValueError(f"MultiHeadAttention layer {getattr(attention, 'name', attention)!r} must be built (called "
                         "once) before its weights can be read. Received: an unbuilt layer")
    return AttentionParts(attention)


def producing_layer(tensor: Any) -> Any:
    """The Keras layer that produced symbolic ``tensor`` of a functional model (its ``_keras_history``)."""
    return tensor._keras_history.layer


def inbound_layers(layer: Any) -> list[Any]:
    """Every layer whose output ``layer`` reads in the functional graph it was called in, call by call."""
    return [inbound for node in layer._inbound_nodes for inbound, *_ in node.iterate_inbound()]


def is_graph_network(model: Any) -> bool:
    """Whether ``model`` is a functional graph of layers (a functional model, or a Sequential built with an input
    shape), whose tensors and nodes can be walked; a subclassed model is not."""
    return bool(getattr(model, "_is_graph_network", False))


def dropout_generator(layer: Any) -> Any:
    """The ``tf.random.Generator`` a Keras ``Dropout`` draws its masks from, or ``None`` when it does not use one
    (Keras' generator-based random layers are off, or the layer is seeded statelessly)."""
    generator = layer._random_generator
    generator._maybe_init()
    if generator._rng_type != generator.RNG_STATEFUL:
        return None
    return generator._generator


def dropout_noise_shape(layer: Any, inputs: Any) -> Any:
    """The noise shape a Keras ``Dropout`` uses for ``inputs`` (its ``noise_shape`` with ``None`` filled in)."""
    return layer._get_noise_shape(inputs)


def unfuse_normalization(layer: Any) -> None:
    """Makes a Keras ``LayerNormalization`` or ``BatchNormalization`` compute unfused (same maths, plain ops):
    DTensor has no layout propagation for ``FusedBatchNormV3``, which both use when fused."""
    layers = keras2().layers
    if isinstance(layer, layers.LayerNormalization):
        layer._fused = False  # chosen in build(); read in every call()
    elif isinstance(layer, layers.BatchNormalization):
        layer.fused = False


def optimizer_mesh(optimizer: Any) -> tuple[bool, Any]:
    """``(takes_mesh, mesh)``: whether this Keras optimizer can lay its variables out on a DTensor mesh (those of
    ``tf.keras.optimizers`` since 2.11 take ``mesh=``), and the mesh it was built with (``None`` if none)."""
    return hasattr(optimizer, "_mesh"), getattr(optimizer, "_mesh", None)


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The variables a built Keras optimizer keeps (its iteration counter and every slot), in its own order."""
    return list(optimizer._variables)


def replace_optimizer_variables(optimizer: Any, replacements: dict[int, Any]) -> None:
    """Puts ``replacements[id(old)]`` in place of each replaced variable of ``optimizer``: in its list of all
    variables and in the per-kind lists its update reads (Adam's ``_momentums``, ``_velocities``, ...)."""
    variables = optimizer._variables
    for i, variable in enumerate(variables):
        if id(variable) in replacements:
            variables[i] = replacements[id(variable)]
    for value in vars(optimizer).values():
        if isinstance(value, list) and value is not variables:
            for j, variable in enumerate(value):
                if id(variable) in replacements:
                    value[j] = replacements[id(variable)]


__all__ += ["intercept_compile"]


def intercept_compile(hook: Any) -> Any:
    """A context manager inside which ``model.compile(...)`` of every Keras model calls
    ``hook(model, keras_compile, *args, **kwargs)`` instead, ``keras_compile`` being Keras' own
    ``Model.compile`` (the hook calls it, or not). What a strategy scope gets from Keras itself (a
    model built inside ``strategy.scope()`` remembers it), a mesh scope needs this for: Keras has
    no public hook that tells the scope which model is being compiled. Restored on exit.

    Keras 2's ``Model.compile`` is intercepted, and Keras 3's too when the ``keras`` package (3.x)
    is imported, so that the hook sees a Keras 3 model compiled inside and can refuse it (with
    :func:`require_keras2`) before it trains outside tensorfleet's reach.
    """
    import contextlib
    import functools
    import sys

    classes = [keras2().Model]
    keras3 = sys.modules.get("keras")  # a Keras 3 model exists only once its package is imported
    if keras3 is not None and getattr(keras3, "Model", None) not in (None, classes[0]) \
            and _keras_major("keras") >= 3:
        classes.append(keras3.Model)

    def patch(model_class: type) -> tuple[type, Any, Any]:
        own = model_class.__dict__.get("compile")  # Keras 3 defines it on a base (Trainer), not on Model
        keras_compile = getattr(model_class, "compile")

        @functools.wraps(keras_compile)
        def compile(self: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 - Keras' own name
            return hook(self, keras_compile, *args, **kwargs)

        return model_class, own, compile

    patches = [patch(c) for c in classes]

    @contextlib.contextmanager
    def intercepting() -> Any:
        for model_class, _, compile in patches:  # noqa: A001
            model_class.compile = compile
        try:
            yield
        finally:
            for model_class, own, _ in patches:
                if own is None:
                    del model_class.compile
                else:
                    model_class.compile = own

    return intercepting()


# ---------------------------------------------------------------------------------------------------------------
# Serving: the names of a model's inputs and outputs, for Keras 2 and Keras 3 alike.

__all__ += ["producing_layer_name"]


def producing_layer_name(tensor: Any) -> str:
    """The name of the layer that made symbolic ``tensor`` (an input or output of a functional or Sequential
    model), in either Keras: Keras 3 keeps it in ``_keras_history.operation``, Keras 2 in ``_keras_history.layer``.
    ``tf_keras``' ``model.input_names`` are these names; a Keras 3 model has no ``input_names``."""
    history = tensor._keras_history
    return str((getattr(history, "operation", None) or history.layer).name)


# ---------------------------------------------------------------------------------------------------------------
# A Keras 3 optimizer under a parameter server (tensorfleet.cluster.resumable): steps run at once on several workers.

__all__ += ["atomic_step_count"]


def atomic_step_count(optimizer: Any) -> None:
    """Makes a Keras 3 optimizer count its steps with one atomic add on its variable.

    Keras 3's ``Variable.assign_add`` is ``assign(self + value)``: a read, then a write. Under a parameter
    server, steps scheduled on several workers update the same variables at once, and two steps that read
    the count before either writes it count once (measured: 24 steps counted of 26 run); Adam's bias
    correction reads that count. Its slot and weight updates go through ``tf.Variable.assign_add``/``_sub``
    already (one op on the ps, atomic); the count is made to as well. Keras 2 counts with
    ``tf.Variable.assign_add``. The counter is ``optimizer._iterations`` (``iterations`` is a derived value
    under gradient accumulation); the override is its own, an instance attribute.
    """
    import tensorflow as tf

    counter = optimizer._iterations
    variable = counter.value  # the tf.Variable (on the ps) behind the Keras variable

    def assign_add(value: Any) -> Any:
        return variable.assign_add(tf.cast(value, variable.dtype))

    counter.assign_add = assign_add
