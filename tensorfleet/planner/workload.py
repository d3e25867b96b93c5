"""What the planner knows about a model: its parameters, activations, traffic and FLOPs per example.

A registered Keras model gives them from its real layers (:func:`workload_from_model`). A
transformer is given by its shape (:class:`TransformerShape`): a known one by name from
:data:`TRANSFORMERS` (GPT-2 small to XL, GPT-3 175B, BERT base and large, :func:`preset_workload`),
or any other by its parameter count with layers, hidden size and attention heads
(:func:`transformer_workload`; with none of them, a GPT-3-like shape ``12 L h^2 = N``,
``h = 128 L`` with 128-wide heads is assumed).

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (MLSys 2023, arXiv:2205.05198), Eq. 1: ``s b h (34 + 5 a s / h)`` bytes per transformer
layer at 16 bits, for sequence length ``s``, micro-batch ``b``, hidden size ``h`` and ``a``
attention heads; and, after its Section 4.3, ``s b h`` bytes for the embeddings' dropout mask on
the first layer, ``4 s b h`` for the final LayerNorm and output projection's inputs and
``4 s b v`` for the 32-bit cross-entropy over a vocabulary of ``v`` (when known) on the last.

Example:
    >>> from tensorfleet.planner.workload import preset_workload, transformer_workload
    >>> w = preset_workload("gpt2-xl")
    >>> w.name, len(w.layer_parameters), int(w.parameters)
    ('gpt2_xl', 48, 1557611200)
    >>> round(w.activation_values * 2 / 1e9, 2)   # GB at 16 bits, batch 1, s=1024 (48 layers: 8.97)
    9.18
    >>> transformer_workload(1.5e9).name
    'transformer-1.5B'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tensorfleet.planner.memory import layer_table
from tensorfleet.registry import Registry
from tensorfleet.validation import integer, number, positive_int

__all__ = [
    "TRANSFORMERS",
    "TransformerShape",
    "Workload",
    "format_count",
    "layer_activation_bytes",
    "preset_workload",
    "transformer_workload",
    "workload_from_model",
]


@dataclass(frozen=True)
class Workload:
    """What the planner needs to know about a model, per example."""

    name: str
    parameters: float
    layer_parameters: tuple[float, ...]
    layer_activations: tuple[float, ...]
    tensor_comm_values: float
    boundary_values: float
    flops_per_example: float
    checkpoint_activations: tuple[float, ...] | None = None
    shape: TransformerShape | None = None
    seq_len: int | None = None  # the sequence length planned for (the shape's is its longest)
    shape_assumed: bool = False
    weight_shapes: tuple[tuple[int, ...], ...] = ()  # a registered model's trainable weights

    def gradient_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes of the gradients one step all-reduces: a registered model's own weights; a transformer's
        from its shape (per block the QKV, projection and two MLP matrices with their biases and two LayerNorms,
        then the embedding tables and what sits outside the blocks as one vector); else one vector."""
        if self.weight_shapes or self.shape is None:
            return self.weight_shapes or ((int(self.parameters),),)
        s, h = self.shape, self.shape.hidden
        block = ((h, 3 * h), (3 * h,), (h, h), (h,), (h, 4 * h), (4 * h,), (4 * h, h), (h,), (h,), (h,), (h,), (h,))
        tables = tuple((rows, h) for rows in (s.vocab, s.seq_len) if rows)
        rest = int(self.parameters) - s.layers * s.layer_parameters - (s.vocab + s.seq_len) * h
        return block * s.layers + tables + (((rest,),) if rest > 0 else ())

    def describe_shape(self) -> str:
        """``48 layers, hidden 1600, 25 heads, seq_len 1024`` (said to be assumed when it is), or ``""``."""
        if self.shape is None:
            return ""
        s = self.shape
        text = f"{s.layers} layers, hidden {s.hidden}, {s.heads} heads, seq_len {self.seq_len}"
        return text + ("; shape assumed GPT-3-like, give layers, hidden and heads" if self.shape_assumed else "")

    @property
    def activation_values(self) -> float:
        return sum(self.layer_activations)


@dataclass(frozen=True)
class TransformerShape:
    """A transformer's shape. ``seq_len`` is its longest sequence (the position table).

    ``encoder`` marks a BERT-style encoder (token-type embeddings, an embedding LayerNorm and
    a pooler); otherwise a GPT-style decoder with a final LayerNorm and an output projection
    tied to the token embeddings.
    """

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int = 0
    encoder: bool = False

    @property
    def layer_parameters(self) -> int:
        """One block: attention (4 h^2 + 4 h), MLP (8 h^2 + 5 h), two LayerNorms (4 h)."""
        return 12 * self.hidden**2 + 13 * self.hidden

    @property
    def embedding_parameters(self) -> int:
        """Token and position embeddings, and what sits outside the blocks."""
        h = self.hidden
        outside = (2 * h + 2 * h + h * h + h) if self.encoder else 2 * h
        return (self.vocab + self.seq_len) * h + outside

    @property
    def parameters(self) -> int:
        return self.layers * self.layer_parameters + self.embedding_parameters


TRANSFORMERS: Registry[TransformerShape] = Registry("transformer")
for _name, _shape, _aliases, _what in (
    ("gpt2", TransformerShape(12, 768, 12, 1024, 50257), ("gpt2_small",), "GPT-2 small, 124M (Radford et al. 2019)"),
    ("gpt2_medium", TransformerShape(24, 1024, 16, 1024, 50257), (), "GPT-2 medium, 355M"),
    ("gpt2_large", TransformerShape(36, 1280, 20, 1024, 50257), (), "GPT-2 large, 774M"),
    ("gpt2_xl", TransformerShape(48, 1600, 25, 1024, 50257), (), "GPT-2 XL, 1.56B"),
    ("gpt3_175b", TransformerShape(96, 12288, 96, 2048, 50257), ("gpt3",), "GPT-3 175B (Brown et al. 2020)"),
    ("bert_base", TransformerShape(12, 768, 12, 512, 30522, encoder=True), (), "BERT base, 110M (Devlin et al. 2019)"),
    ("bert_large", TransformerShape(24, 1024, 16, 512, 30522, encoder=True), (), "BERT large, 335M"),
):
    TRANSFORMERS.register(_name, _shape, description=_what, aliases=_aliases)


def layer_activation_bytes(*, seq_len: int, hidden: int, heads: int, batch: int = 1) -> int:
    """Korthikanti et al.'s activation bytes of one transformer layer at 16 bits: ``s b h (34 + 5 a s / h)``.

    Example:
        >>> layer_activation_bytes(seq_len=1024, hidden=1600, heads=25)   # GPT-2 XL
        186777600
    """
    s, h, a, b = (positive_int(k, v) for k, v in (("seq_len", seq_len), ("hidden", hidden), ("heads", heads),
                                                   ("batch", batch)))
    return s * b * (34 * h + 5 * a * s)


def _workload(name: str, parameters: float, shape: TransformerShape, seq_len: int,
              layer_parameters: tuple[float, ...], *, assumed: bool = False) -> Workload:
    layers, hidden = shape.layers, shape.hidden
    per_layer = layer_activation_bytes(seq_len=seq_len, hidden=hidden, heads=shape.heads)
    acts = [float(per_layer)] * layers
    acts[0] += seq_len * hidden  # the embeddings' dropout mask
    acts[-1] += 4 * seq_len * hidden + 4 * seq_len * shape.vocab  # final LayerNorm, projection, loss
    outside = [0.0] * layers
    outside[0], outside[-1] = acts[0] - per_layer, acts[-1] - per_layer
    # Bytes at 16 bits, as values of 2 bytes; recomputation does not rebuild what lies outside the blocks.
    return Workload(
        name=name,
        parameters=float(parameters),
        layer_parameters=layer_parameters,
        layer_activations=tuple(a / 2 for a in acts),
        tensor_comm_values=4.0 * layers * seq_len * hidden,
        boundary_values=float(seq_len * hidden),
        flops_per_example=6.0 * parameters * seq_len,
        # Full recomputation keeps only each layer's input (s x h) and rebuilds one layer at a time.
        checkpoint_activations=tuple(float(seq_len * hidden) + extra / 2 for extra in outside),
        shape=shape,
        seq_len=seq_len,
        shape_assumed=assumed,
    )


def transformer_workload(parameters: float, *, layers: int | None = None, hidden: int | None = None,
                         heads: int | None = None, seq_len: int = 1024, name: str | None = None) -> Workload:
    """A decoder-only transformer of ``parameters`` weights, spread evenly over its layers.

    ``hidden`` and ``heads`` go together: the activations depend on both (``5 a s / h``), and
    no head count can be guessed from a hidden size (GPT-2 XL: 1600 and 25, 64 wide). With
    neither, the shape is GPT-3-like with 128-wide heads.

    Example:
        >>> w = transformer_workload(175e9, layers=96, hidden=12288, heads=96, seq_len=2048)
        >>> round(w.parameters / 1e9), w.shape.heads
        (175, 96)
    """
    number("parameters", parameters, above=0)
    layers = integer("layers", layers, minimum=1, optional=True)
    hidden = integer("hidden", hidden, minimum=1, optional=True)
    heads = integer("heads", heads, minimum=1, optional=True)
    seq_len = positive_int("seq_len", seq_len)
    if (hidden is None) != (heads is None):
        raise ValueError(
            "Give hidden and heads together: activation memory grows with heads x seq_len / hidden "
            f"(Korthikanti et al.), and no head count follows from a hidden size. Received: hidden={hidden}, "
            f"heads={heads}; known models have presets: {', '.join(TRANSFORMERS.names())}"
        )
    if hidden is not None and hidden % heads:
        raise ValueError(f"hidden must be a multiple of heads (each head is hidden/heads wide). Received: "
                         f"hidden={hidden}, heads={heads}")
    assumed = hidden is None
    if layers is None and hidden is None:
        layers = max(1, round((parameters / (12 * 128**2)) ** (1 / 3)))
    if hidden is None:
        hidden = max(1, round(math.sqrt(parameters / (12 * layers))))
        heads = max(1, hidden // 128)  # the assumed shape's 128-wide heads
    if layers is None:
        layers = max(1, round(parameters / (12 * hidden**2)))
    shape = TransformerShape(layers=layers, hidden=hidden, heads=heads, seq_len=seq_len)
    return _workload(name or f"transformer-{format_count(parameters)}", parameters, shape, seq_len,
                     tuple([parameters / layers] * layers), assumed=assumed)


def preset_workload(preset: str, *, seq_len: int | None = None) -> Workload:
    """A known transformer of :data:`TRANSFORMERS`, with its exact parameter count.

    The embeddings are counted with the first layer, where they are looked up (a pipeline's
    first stage holds them). ``seq_len`` may be shorter than the model's longest sequence.

    Example:
        >>> w = preset_workload("bert-base", seq_len=128)
        >>> int(w.parameters), w.shape.seq_len
        (109482240, 512)
    """
    name = TRANSFORMERS.canonical(preset)
    shape = TRANSFORMERS.get(name)
    seq = shape.seq_len if seq_len is None else positive_int("seq_len", seq_len)
    if seq > shape.seq_len:
        raise ValueError(f"{name} takes sequences of at most {shape.seq_len} tokens (its position table). "
                         f"Received: seq_len={seq}")
    blocks = [float(shape.layer_parameters)] * shape.layers
    blocks[0] += shape.embedding_parameters
    return _workload(name, shape.parameters, shape, seq, tuple(blocks))


def workload_from_model(name: str, **model_kwargs: Any) -> Workload:
    """The workload of a registered Keras model, from its real layers.

    Example:
        >>> workload_from_model("digits_cnn").parameters
        38282.0
    """
    from tensorfleet.models import build

    model = build(name, **{"keras": "keras2", **model_kwargs})  # the memory model reads Keras 2 layers
    table = layer_table(model)
    with_weights = [row.activation_values for row in table if row.parameters]
    return Workload(
        name=name,
        parameters=float(model.count_params()),
        layer_parameters=tuple(float(r.parameters) for r in table),
        layer_activations=tuple(float(r.activation_values) for r in table),
        # Sharded layers' outputs are all-reduced once forward and once backward.
        tensor_comm_values=2.0 * sum(with_weights),
        boundary_values=float(max(r.activation_values for r in table)),
        flops_per_example=6.0 * model.count_params(),
        weight_shapes=tuple(tuple(int(d) for d in w.shape) for w in model.trainable_weights),
    )


def format_count(n: float) -> str:
    """A count in the planner's words: ``1.5B``, ``38.282K``.

    Example:
        >>> format_count(1.5e9), format_count(38282)
        ('1.5B', '38.282K')
    """
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"
