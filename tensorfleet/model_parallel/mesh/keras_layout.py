"""Mesh-TF layouts for the weights of any Keras model: which weight is split over which mesh dimension.

Design
------
A Keras user writes the mesh and the layout the way Mesh-TF users do, and builds the model as
always, inside ``mesh.scope()``::

    mesh = Mesh("b:2;m:2", "batch:b;hidden:m;heads:m;vocab:m")
    with mesh.scope():
        model = build_my_keras_model()        # Sequential or functional, any layers
        model.compile(optimizer="adam", loss=..., metrics=[...])
    model.fit(x, y, batch_size=32, epochs=5, callbacks=[...])   # Keras' fit: progress bar, callbacks

**Tensor dimension names.** A layout rule names a tensor dimension; each weight of a Keras layer
has its dimensions named by the layer's kind (:func:`weight_dimensions`):

=========================  ======================================  =================================
layer                      weight (shape)                          dimension names
=========================  ======================================  =================================
Dense, EinsumDense         kernel (in, units), bias (units)        ``hidden`` on the units (also a
                                                                   Dense over sequences, 6.)
MultiHeadAttention         query/key/value kernel (d, heads, k)    ``heads``
                           attention_output kernel (heads, k, d)   ``heads``; its bias replicated
Embedding                  embeddings (vocab, dim)                 ``vocab``: kept whole, see 7.
Conv1D/2D                  kernel (..., in, out), bias (out)       ``channels``: kept whole, see 4.
DepthwiseConv2D            depthwise_kernel (kh, kw, channels, q)  ``channels`` (channels_last), see 8.
                           bias (channels * q)                     ``channels``
LayerNormalization,        gamma, beta, moving statistics          replicated: each is read whole
BatchNormalization                                                 by every shard of its input
=========================  ======================================  =================================

The input's first dimension is ``batch``. A dimension no rule names is replicated. Finer control
comes from variable-path patterns, as ``tf.keras.dtensor.experimental.LayoutMap`` (and Keras 3's
distribution ``LayoutMap``) take them: ``patterns={"d1/kernel": (None, "m")}`` maps a regular
expression over the weight's path (``"<layer>/<weight>"``, with sub-layers' names between, e.g.
``"attention/query/kernel"``) to one mesh dimension (or ``None``) per axis; a pattern wins over
the rules. A rule that would split a weight whose size the mesh dimension does not divide leaves
that weight replicated, with a note (:attr:`WeightLayout.note`); only what cannot work at all
(a pattern naming a mesh dimension the mesh has not, or of another rank than the weight) is an
error naming the weight, the axis and the value.

**The mechanism, measured on TF 2.14 with 4 logical CPUs (a 2x2 mesh).** DTensor lays out the
weights: every Keras weight created under ``mesh.scope()`` becomes a ``dtensor.DVariable`` with
its layout (a ``tf.variable_creator_scope`` that reads the layer being built from Keras' call
context), inside Keras' own ``layout_map_scope`` so that Keras' counters and loss containers live
on the mesh. DTensor's SPMD expansion then places every op, backward pass included, with its
shards and inserts the collectives; optimizers built with ``mesh=`` create their slots with
``zeros_like(variable)``, so Adam's ``m`` and ``v`` carry their variable's layout. Forward passes
and gradients equal one device's (logits within 5e-7, every gradient within 3.3e-7). What
TF 2.14's DTensor does not do, and what tensorfleet supplies (:mod:`.keras_model`):

1. ``model.fit`` on arrays or a plain ``tf.data.Dataset`` fails ("Could not find
   ``tf._element_layouts``"): batches must come from a ``dtensor.DTensorDataset``. The trainer
   builds one from ``x, y`` (batch split over the ``batch`` rule's mesh dimension).
2. One ``tf.function`` that computes gradients *and* applies them gives wrong updates: an
   optimizer slot or metric variable read after its update in the same step sometimes yields
   the value from before it (Adam moved LayerNormalization's gamma by -112 instead of -0.01, left
   most other weights unmoved, and Keras' running-mean loss lagged one step). With gradients
   computed in one function and relaid out to their variable's layout and applied in a second,
   5 Adam steps matched one device (losses within 2.4e-7, weights within 2.2e-6). The trainer's
   ``train_function`` runs those two functions per step under Keras' own ``fit`` loop; gradient
   clipping computed in the update function was wrong the same way, so it runs in the first.
3. Fused normalizations (``FusedBatchNormV3``, which LayerNormalization also uses) have no
   layout propagation; the trainer turns the layers' fused path off (same maths, other rounding:
   one device's BatchNormalization runs the fused oneDNN kernel, so ResNet-8 after 5 Adam steps
   differs from it by up to 1.5e-5 in one kernel element, and by 3.4e-6 from one device computing
   the unfused ops too).
4. A convolution needs a fully replicated filter ("Filter for convolution must have fully
   replicated layout"): ``channels`` leaves convolution kernels replicated, with a note.
5. ``get_weights()`` of a sharded DVariable fails; the trainer gathers shards to the host.
6. A Dense over inputs of rank 3 (a sequence) multiplies with ``tf.tensordot`` (reshape to
   ``(batch * seq, in)``, matmul, reshape back), which DTensor expands with the units split: the
   MLP and output head of a transformer split like any Dense (the small GPT equals one device).
7. A gather from a table split by rows fails ("DTensor does not support sharded 0th dimension
   for the resource tensor for ResourceGatherOp"): ``vocab`` leaves embedding tables replicated,
   with a note.
8. Some gradients have no layout propagation at all: ``AvgPoolGrad`` (AveragePooling1D/2D) and
   ``DepthwiseConv2dNativeBackpropFilter`` (DepthwiseConv2D). The trainer takes gradients with
   ``tf.gradients`` under a gradient override that spreads each pooled gradient evenly over its
   window (non-overlapping VALID pools, the Keras default), which DTensor lays out: ResNet-8 (it
   pools with AveragePooling2D) trains. DepthwiseConv2D computes on the mesh as a sum over its
   kernel taps of strided slices times per-channel weights (:mod:`.keras_layers`), which DTensor
   lays out and differentiates, split along channels by the ``channels`` rule.
9. Dropout draws its masks from a ``tf.random.Generator`` (the scope turns Keras' generator-based
   random layers on, as DTensor requires, and restores the choice on exit). DTensor gives each
   shard of a split random draw a key of its own, so the mask would not be one device's; on the
   mesh the draw is made whole on every device and each keeps its part (:mod:`.keras_layers`): the
   same mask as one device whose Keras uses the generator too
   (``tf.keras.backend.experimental.enable_tf_random_generator()``) with the same layer seed.

**Optimizer state (ZeRO).** ``Mesh(..., zero=1..3)`` splits model states over the ``batch`` mesh
dimension (Rajbhandari et al., 2020): the optimizer slots (stage 1; Adam's ``m`` and ``v``, DTensor
gathering what each update reads), also the gradients (2), also the trainable weights, gathered for
each forward and backward pass (3); see :mod:`.zero`. Still exact; on ``b:4`` the small GPT's Adam
state per device is 1/4 (bench/mesh_memory.py).

Keras' ``LayoutMap`` path (lazy variables mapped to layouts by their object paths once the model is
built) was tried first: its keys are paths such as ``"d1.kernel"`` that say nothing of the layer's
kind, so no rule can name "the columns of every Dense" with it (and its weights did not move in a
single-function step, the defect of 2.). tensorfleet therefore lays each weight out when it is
created, knowing its layer; path patterns still give LayoutMap's fine control. tensorfleet's own
tensor-parallel layers (the ``keras`` backend of ``Mesh.fit``) stay for the chains they cover.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

from tensorfleet.compat.keras import module_of
from tensorfleet.model_parallel.mesh.keras_layers import adapt

__all__ = ["KEPT_WHOLE", "KerasLayout", "WeightLayout", "weight_dimensions"]


def weight_dimensions(layer: Any, name: str, rank: int, input_rank: int = 2) -> tuple[tuple[str | None, ...], str]:
    """The tensor dimension name of each axis of weight ``name`` of ``layer`` (``None``: never split),
    and the dimension a rule may name that this weight keeps whole on purpose (see ``KEPT_WHOLE``).

    Example:
        >>> import tensorflow as tf
        >>> weight_dimensions(tf.keras.layers.Dense(4), "kernel", 2)
        ((None, 'hidden'), '')
        >>> weight_dimensions(tf.keras.layers.Embedding(10, 4), "embeddings", 2)
        ((None, None), 'vocab')
    """

    layers = module_of(layer, "weight_dimensions", "layer").layers  # the same layer names in either Keras
    axes: list[str | None] = [None] * rank
    if isinstance(layer, layers.DepthwiseConv2D) and layer.data_format == "channels_last":
        axes[2 if name == "depthwise_kernel" and rank == 4 else 0] = "channels"  # (kh, kw, channels, multiplier)
        return tuple(axes), ""
    if isinstance(layer, (layers.Conv1D, layers.Conv2D, layers.Conv3D, layers.DepthwiseConv2D)):
        return tuple(axes), "channels"
    if isinstance(layer, layers.Embedding):
        return tuple(axes), "vocab"
    if isinstance(layer, layers.EinsumDense) and layer.name in ("query", "key", "value") and rank >= 2:
        axes[-2] = "heads"  # (d_model, heads, key_dim) and its bias (heads, key_dim)
    elif isinstance(layer, layers.EinsumDense) and layer.name == "attention_output" and name == "kernel":
        axes[0] = "heads"  # (heads, key_dim, d_model)
    elif isinstance(layer, layers.EinsumDense) and layer.name == "attention_output":
        pass  # the output bias is added after the heads are summed
    elif isinstance(layer, (layers.Dense, layers.EinsumDense)) and name in ("kernel", "bias") and rank >= 1:
        axes[-1] = "hidden"
    return tuple(axes), ""


KEPT_WHOLE = {
    "channels": "convolution kernels stay replicated: TF 2.14's DTensor convolves only with a replicated filter",
    "vocab": "embedding tables stay replicated: TF 2.14's DTensor gathers only from a table whose rows are whole "
             "(a pattern can split its columns, e.g. {'embed/embeddings': (None, 'm')})",
}
"""Why a dimension a rule names is not split in some weights, as the note on those weights says it."""


@dataclasses.dataclass(frozen=True)
class WeightLayout:
    """Where one weight lives: the mesh dimension of each axis (``None``: whole on every device)."""

    path: str
    shape: tuple[int, ...]
    mesh_axes: tuple[str | None, ...]
    note: str = ""

    @property
    def sharded(self) -> bool:
        """Whether any axis is split."""
        return any(a is not None for a in self.mesh_axes)


class KerasLayout:
    """Decides each Keras weight's layout from Mesh-TF rules and variable-path patterns.

    Args:
        mesh_dims: mesh dimension name -> size (``MeshLayout.mesh_dims``).
        rules: tensor dimension name -> mesh dimension name (``MeshLayout.rules``).
        patterns: regular expression over weight paths -> one mesh dimension name (or ``None``)
            per axis; the first pattern that matches (``re.search``) wins over the rules.

    Example:
        >>> import tensorflow as tf
        >>> layout = KerasLayout({"b": 2, "m": 2}, {"batch": "b", "hidden": "m"})
        >>> layout.weight(tf.keras.layers.Dense(8, name="d1"), "d1/kernel", "kernel", (4, 8)).mesh_axes
        (None, 'm')
        >>> layout.weight(tf.keras.layers.Dense(3, name="out"), "out/bias", "bias", (3,))
        WeightLayout(path='out/bias', shape=(3,), mesh_axes=(None,), note="mesh dimension 'm' of size 2 does not divide
        hidden of size 3: replicated")
    """

    def __init__(self, mesh_dims: Mapping[str, int], rules: Mapping[str, str],
                 patterns: Mapping[str, Sequence[str | None]] | None = None) -> None:
        self.mesh_dims = dict(mesh_dims)
        self.rules = dict(rules)
        self.patterns: dict[str, tuple[str | None, ...]] = {}
        for pattern, axes in (patterns or {}).items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"patterns keys must be regular expressions over weight paths such as 'd1/kernel'. "
                                 f"Received: {pattern!r} ({exc})") from None
            axes = tuple(axes) if isinstance(axes, (list, tuple)) else axes
            if not isinstance(axes, tuple) or any(a is not None and a not in self.mesh_dims for a in axes):
                raise ValueError(f"patterns[{pattern!r}] must give one mesh dimension ({', '.join(self.mesh_dims)}) "
                                 f"or None per axis of the weight. Received: {axes!r}")
            self.patterns[pattern] = axes
        self.decided: list[WeightLayout] = []
        """Every weight laid out so far, in creation order."""

    @property
    def batch_axis(self) -> str | None:
        """The mesh dimension the batch is split over, if any."""
        return self.rules.get("batch")

    def weight(self, layer: Any, path: str, name: str, shape: Sequence[int], input_rank: int = 2) -> WeightLayout:
        """The layout of weight ``name`` (at ``path``) of ``layer`` (called on inputs of ``input_rank``),
        recorded in :attr:`decided`."""
        shape = tuple(int(s) for s in shape)
        adapt(layer, self.batch_axis)  # the same maths in ops DTensor lays out, where Keras' own ops are not
        for pattern, axes in self.patterns.items():
            if re.search(pattern, path):
                if len(axes) != len(shape):
                    raise ValueError(f"patterns[{pattern!r}] gives {len(axes)} axes but weight {path!r} has shape "
                                     f"{shape} ({len(shape)} axes). Received: {axes!r}")
                for axis, (mesh_dim, size) in enumerate(zip(axes, shape)):
                    if mesh_dim is not None and size % self.mesh_dims[mesh_dim]:
                        raise ValueError(f"Weight {path!r} of shape {shape} cannot be split over mesh dimension "
                                         f"{mesh_dim!r} of size {self.mesh_dims[mesh_dim]} on axis {axis} (size "
                                         f"{size}). Received: patterns[{pattern!r}]={axes!r}")
                return self._record(WeightLayout(path, shape, axes, f"pattern {pattern!r}"))
        dims, kept = weight_dimensions(layer, name, len(shape), input_rank)
        axes_out: list[str | None] = []
        notes = [KEPT_WHOLE[kept]] if kept in self.rules else []
        used: set[str] = set()
        for dim, size in zip(dims, shape):
            mesh_dim = self.rules.get(dim) if dim else None
            if mesh_dim is not None and (size % self.mesh_dims[mesh_dim] or mesh_dim in used):
                notes.append(f"mesh dimension {mesh_dim!r} of size {self.mesh_dims[mesh_dim]} does not divide {dim} "
                             f"of size {size}: replicated")
                mesh_dim = None
            if mesh_dim is not None:
                used.add(mesh_dim)
            axes_out.append(mesh_dim)
        return self._record(WeightLayout(path, shape, tuple(axes_out), "; ".join(notes)))

    def _record(self, decided: WeightLayout) -> WeightLayout:
        self.decided.append(decided)
        return decided

    def summary(self) -> str:
        """One line per weight: path, shape, layout and note."""
        lines = []
        for w in self.decided:
            axes = ",".join(a or "-" for a in w.mesh_axes)
            lines.append(f"{w.path:40s} {str(w.shape):18s} [{axes}]" + (f"  ({w.note})" if w.note else ""))
        return "\n".join(lines)
