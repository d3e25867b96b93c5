"""tf_keras internals that model parallelism needs (``tensorfleet.model_parallel``).

tf_keras keeps them in ``tf_keras.src`` (TensorFlow >= 2.16), Keras 2.14 in ``keras.src``: :func:`keras_internal`
decides which from the package :func:`tensorfleet.compat.keras.keras2` really is, so no caller names either. The
mesh lays out Keras 2 models (:func:`tensorfleet.compat.keras.require_keras2` refuses the others first).
"""

from __future__ import annotations

from typing import Any

from tensorfleet.compat.keras import keras2, keras_major

# the package ``tf.keras`` really is, so no caller names either.

__all__ = [
    "AttentionParts", "attention_parts", "build_call_context", "dropout_generator", "dropout_noise_shape",
    "inbound_layers", "is_graph_network", "keras_internal", "layout_map_scope", "learning_phase",
    "loss_function_wrapper", "optimizer_mesh", "optimizer_variables", "producing_layer",
    "replace_optimizer_variables", "smart_cond", "unfuse_normalization",
]


def keras_internal(module: str) -> Any:
    """``<keras package>.src.<module>`` of the Keras 2 behind ``tf.keras``: ``tf_keras.src`` with tf_keras,
    ``keras.src``
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
            and keras_major("keras") >= 3:
        classes.append(keras3.Model)

    def patch(model_class: Any) -> tuple[Any, Any, Any]:  # a Keras Model class
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


