"""A Keras model read as one chain of layers, each feeding the next.

Mesh layouts and pipeline stages both split a model along its layers, so both need the model to
be a chain: a ``Sequential``, or a functional model without branches (a branching block can be
one custom layer). :func:`chain_layers` returns that chain or says which layer breaks it.

Example:
    >>> import tensorflow as tf
    >>> model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, name="a"),
    ...                              tf.keras.layers.Dense(2, name="b")])
    >>> [layer.name for layer in chain_layers(model)]
    ['a', 'b']
"""

from __future__ import annotations

from typing import Any

from tensorfleet.compat.keras import Keras, keras_of, module_of

__all__ = ["chain_layers"]


def chain_layers(model: Any, *, supported: str = "") -> list[Any]:
    """The layers of ``model`` in order, without its ``InputLayer``.

    Args:
        model: a Keras model.
        supported: what the caller can split, added to the error (e.g. the layers a Mesh supports).

    Raises:
        ValueError: the model has no layers, or a layer does not take the previous layer's
            output as its only input (the error names the layer, its type and its inputs).
    """

    keras = module_of(model, "chain_layers")
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    if not layers:
        raise ValueError(f"Model {model.name!r} has no layers to split across devices.")
    if not isinstance(model, keras.Sequential):
        previous = None
        for layer in layers:
            breaks = _how_it_breaks_the_chain(layer, previous)
            if breaks:
                raise ValueError(
                    f"Splitting a model across devices needs a model whose layers form one chain (each layer "
                    f"feeding the next); layer {layer.name!r} of model {model.name!r} does not. Wrap branching "
                    f"parts in one layer.{' ' + supported if supported else ''} Received: layer {layer.name!r} of "
                    f"type {type(layer).__name__}, which {breaks}")
            previous = layer
    return layers


def _how_it_breaks_the_chain(layer: Any, previous: Any) -> str:
    """Why ``layer`` is not the next link after ``previous`` ("" when it is)."""
    calls = _calls(layer)
    if len(calls) != 1:
        return f"is called {len(calls)} times"
    inbound = calls[0]
    if len(inbound) != 1:
        return f"takes {len(inbound)} inputs ({', '.join(repr(source.name) for source in inbound)})"
    if previous is not None and inbound[0] is not previous:
        return f"takes {inbound[0].name!r} instead of the layer before it ({previous.name!r})"
    return ""


def _calls(layer: Any) -> list[list[Any]]:
    """The layers each call of ``layer`` in a functional graph read from, call by call."""
    import tensorflow as tf

    if keras_of(layer, "chain_layers", "layer") is Keras.KERAS3:
        from tensorfleet.compat.keras3 import layer_calls

        return layer_calls(layer)
    return [tf.nest.flatten(node.inbound_layers) for node in layer.inbound_nodes]
