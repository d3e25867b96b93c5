"""A plain Keras model as the model TFF trains: loss and metrics from its last layer, the input
spec from the client data, and a clear error when the two do not fit; :func:`central_step`
evaluates it with that loss.

Example:
    >>> import tensorflow as tf
    >>> spec = {"x": tf.TensorSpec([64], tf.float32), "y": tf.TensorSpec([], tf.int32)}
    >>> model = tf.keras.Sequential([tf.keras.layers.Dense(10, input_shape=(8, 8))])
    >>> check_model(model, spec)
    Traceback (most recent call last):
    ValueError: The model's input shape does not match the client data: the model takes (None, 8, 8), the examples have
    x of shape (64,). Build the model for inputs of shape (64,).
    >>> loss, metrics = loss_and_metrics(model)
    >>> loss.get_config()["from_logits"], [m.name for m in metrics]
    (True, ['accuracy'])
"""

from __future__ import annotations

import collections
from typing import Any, Callable

import numpy as np

from tensorfleet.compat.keras import module_of

__all__ = ["central_step", "check_model", "input_spec", "loss_and_metrics", "tff_model_fn"]


def loss_and_metrics(model: Any) -> tuple[Any, list[Any]]:
    """Sparse categorical cross-entropy (from logits unless the last layer is a softmax) and accuracy, in the
    model's own Keras."""
    keras = module_of(model, "tfl.federated.Simulation (the model of model_fn)")
    from_logits = getattr(model.layers[-1], "activation", None) is not keras.activations.softmax
    return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits), \
        [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


def input_spec(element_spec: Any) -> Any:
    """The batched input spec of client examples ``OrderedDict(x=..., y=...)``."""
    import tensorflow as tf

    spec = element_spec
    if not isinstance(spec, dict) or set(spec) != {"x", "y"}:
        raise ValueError("Client examples must be OrderedDict(x=..., y=...) (use "
                         "tensorfleet.federated.clients.partition, or ClientData.preprocess to rename). Received "
                         f"element spec: {spec}")
    return collections.OrderedDict(
        x=tf.TensorSpec([None, *spec["x"].shape], spec["x"].dtype),
        y=tf.TensorSpec([None, *spec["y"].shape], spec["y"].dtype))


def check_model(model: Any, element_spec: Any) -> None:
    """ValueError when ``model`` does not take the ``x`` of the client examples."""
    expected = tuple(element_spec["x"].shape)
    got = tuple(model.input_shape[1:]) if not isinstance(model.input_shape, list) else None
    if got is None or len(got) != len(expected) or any(g is not None and g != e for g, e in zip(got, expected)):
        raise ValueError(f"The model's input shape does not match the client data: the model takes "
                         f"{model.input_shape}, the examples have x of shape {expected}. Build the model for "
                         f"inputs of shape {expected}.")


def tff_model_fn(model_fn: Callable[[], Any], element_spec: Any) -> Callable[[], Any]:
    """The ``model_fn`` TFF needs: ``model_fn()``'s Keras model wrapped with ``from_keras_model`` (tff backend)."""
    from tensorfleet.compat.tff import import_tff

    tff = import_tff("the tff backend's model")

    spec = input_spec(element_spec)

    def fn() -> Any:
        model = model_fn()
        loss, metrics = loss_and_metrics(model)
        return tff.learning.models.from_keras_model(model, input_spec=spec, loss=loss, metrics=metrics)

    return fn


def central_step(model: Any, x: np.ndarray, y: np.ndarray) -> Any:
    """``(loss sum, correct)`` of ``model`` on a batch shaped as ``x``, ``y`` (any number of rows), with the
    loss of :func:`loss_and_metrics`, as one TensorFlow function traced once: a simulation evaluates on its
    central test data every round by default, and an eager call of a small model costs more than its
    arithmetic."""
    import tensorflow as tf

    loss_fn, _ = loss_and_metrics(model)

    def step(xb: Any, yb: Any) -> Any:
        logits = model(xb, training=False)
        rows = tf.cast(tf.shape(logits)[0], tf.float32)
        hits = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int64), tf.cast(yb, tf.int64))
        return loss_fn(yb, logits) * rows, tf.reduce_sum(tf.cast(hits, tf.int64))

    signature = [tf.TensorSpec([None, *x.shape[1:]], tf.as_dtype(x.dtype)),
                 tf.TensorSpec([None, *y.shape[1:]], tf.as_dtype(y.dtype))]
    return tf.function(step, input_signature=signature, autograph=False)
