"""The Keras models a mesh layout can split, and the names of their tensor dimensions.

Supported models (:data:`SUPPORTED`) are chains of ``Dense``, ``GlobalAveragePooling1D`` and
:class:`~tensorfleet.models.transformer.TransformerBlock` layers (the ``digits_mlp`` and
``transformer_block`` models). :func:`mesh_steps` describes such a model once for every
backend, one :class:`MeshStep` per layer. The tensor dimensions are named ``batch``, ``seq``,
``features`` (the input), ``hidden`` (the output of a Dense that feeds another Dense, and the
block's MLP), ``hidden_2`` (a second hidden Dense in a row), ``d_model`` (the embedding),
``heads``, ``kv`` (per-head channels), ``memory_seq`` and ``classes``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tensorfleet.compat.keras import keras2
from tensorfleet.model_parallel.chain import chain_layers

__all__ = ["ACTIVATIONS", "SUPPORTED", "MeshStep", "mesh_steps", "model_dimensions"]

ACTIVATIONS = frozenset({"linear", "relu", "tanh", "sigmoid"})
"""The Dense activations every backend can run."""

SUPPORTED = (f"The mtf and keras mesh backends (and Mesh.fit) run Sequential and functional models that are chains "
             f"of Dense (activation "
             f"{', '.join(sorted(ACTIVATIONS))}), GlobalAveragePooling1D and tensorfleet's TransformerBlock "
             f"layers (the block keeps its residual connections inside), ending in a Dense of class logits. "
             f"Any other Keras model trains with its own compile and fit when built and compiled inside "
             f"mesh.scope() of a Mesh with backend='dtensor'.")
"""What a mesh can split, as every error about an unsupported model says it."""

_HIDDEN = ("hidden", "hidden_2")


@dataclasses.dataclass
class MeshStep:
    """One layer of a supported model, as the mesh backends see it."""

    kind: str  # "dense" | "block" | "pool"
    layer: Any
    out_dim: str = ""
    """A Dense layer's output dimension name (``hidden``, ``hidden_2``, ``d_model`` or ``classes``)."""


def _dense_out_dim(layers: list[Any], i: int, steps: list[MeshStep]) -> str:
    from tensorfleet.models.transformer import block_class

    TransformerBlock = block_class("keras2")  # noqa: N806 - the class, by its name
    if i == len(layers) - 1:
        return "classes"
    if isinstance(layers[i + 1], TransformerBlock):
        return "d_model"
    if steps and steps[-1].out_dim in _HIDDEN and steps[-1].kind == "dense":
        return _HIDDEN[1 - _HIDDEN.index(steps[-1].out_dim)]
    return "hidden"


def mesh_steps(model: Any) -> list[MeshStep]:
    """``model`` as a list of :class:`MeshStep`; a clear error for anything the backends cannot run.

    Example:
        >>> import tensorfleet as tfl
        >>> [(s.kind, s.out_dim) for s in mesh_steps(tfl.models.build("digits_mlp", keras="tf_keras"))]
        [('dense', 'hidden'), ('dense', 'classes')]
    """
    from tensorfleet.models.transformer import block_class

    TransformerBlock = block_class("keras2")  # noqa: N806 - the class, by its name
    _check_keras_model(model)
    layers = chain_layers(model, supported=SUPPORTED)
    if len(model.inputs[0].shape) not in (2, 3):
        raise ValueError(f"Mesh layouts support inputs of shape (batch, features) or (batch, seq, features). "
                         f"Received: input shape {tuple(model.inputs[0].shape)}")
    steps: list[MeshStep] = []
    for i, layer in enumerate(layers):
        if isinstance(layer, keras2().layers.Dense):
            if layer.activation.__name__ not in ACTIVATIONS:
                raise ValueError(f"{SUPPORTED} Received: layer {layer.name!r} of type Dense with activation "
                                 f"{layer.activation.__name__!r}")
            steps.append(MeshStep("dense", layer, _dense_out_dim(layers, i, steps)))
        elif isinstance(layer, TransformerBlock):
            steps.append(MeshStep("block", layer, "d_model"))
        elif isinstance(layer, keras2().layers.GlobalAveragePooling1D):
            steps.append(MeshStep("pool", layer))
        else:
            raise ValueError(f"{SUPPORTED} Received: layer {layer.name!r} of type {type(layer).__name__}")
    if steps[-1].kind != "dense":
        raise ValueError(f"{SUPPORTED} Received: last layer {layers[-1].name!r} of type {type(layers[-1]).__name__}")
    return steps


def _check_keras_model(model: Any) -> None:
    """A Keras model whose input shape and layer order Keras knows, or one error that says what to do."""

    from tensorfleet.compat.keras import is_keras3_model, require_keras2

    if is_keras3_model(model):
        require_keras2(model, "Mesh")
    if not isinstance(model, keras2().Model):
        raise TypeError(f"A Mesh trains a Keras model. Received: model={model!r} of type {type(model).__name__}")
    if model.inputs:
        return
    if isinstance(model, keras2().Sequential):
        raise ValueError(f"A Mesh lays out tensor dimensions from the model's input shape, and model {model.name!r} "
                         "has none yet: build the model first (model.build(input_shape), e.g. model.build((None,) + "
                         "x.shape[1:])) or give it an Input (tf.keras.Input(shape) as its first layer). Received: "
                         f"Sequential model {model.name!r} with built={model.built}")
    raise ValueError(f"A Mesh reads the model's layers in the order they run, which Keras records only for "
                     f"Sequential and functional models; write model {model.name!r} as one of those. "
                     f"Received: subclassed model {model.name!r} of type {type(model).__name__}")


def model_dimensions(model: Any, batch_size: int) -> dict[str, int]:
    """Names and sizes of the tensor dimensions of a supported Keras model (see module docstring).

    Example:
        >>> import tensorfleet as tfl
        >>> model_dimensions(tfl.models.build("digits_mlp", keras="tf_keras"), 32)
        {'batch': 32, 'features': 64, 'hidden': 64, 'classes': 10}
    """
    steps = mesh_steps(model)
    shape = model.inputs[0].shape
    dims = {"batch": batch_size}
    if len(shape) == 3:
        dims["seq"] = int(shape[1])
        dims["memory_seq"] = int(shape[1])
    dims["features"] = int(shape[-1])
    for step in steps:
        if step.kind == "dense":
            dims[step.out_dim] = int(step.layer.units)
        elif step.kind == "block":
            block = step.layer
            dims.update(heads=block.num_heads, kv=block.key_dim, hidden=block.hidden)
    return dims
