"""GPT-2 small (124,439,808 parameters, GPT-2's exact count) in Keras 3, trained a few steps on the plan's mesh.

Run under the planner, which prints its memory per device and step time beside the run's:

    tensorfleet plan --transformer gpt2 --seq-len 128 --batch 8 --devices 4 --device-memory 2GB \\
        --bandwidth 10Gbps --precision float32 --device-tflops 0.05 --report gpt2_plan.json \\
        --run-processes 2 --run bench/plan_run_gpt2.py

Random tokens (the bytes and the step time do not depend on them); 3 steps of the plan's batch, the first of
which traces. Blocks as GPT-2's: pre-LayerNorm, causal attention, a 4x GELU MLP; the output projection is the
token embedding, tied. Results: bench/RESULTS.md.
"""

from __future__ import annotations

import keras
import numpy as np

import tensorfleet as tfl

VOCAB, POSITIONS, HIDDEN, HEADS, LAYERS = 50257, 1024, 768, 12, 12
L = keras.layers


class TiedLogits(L.Layer):
    """Logits against the token embedding (GPT-2 ties its output projection to it)."""

    def __init__(self, embedding: L.Embedding, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, h: object) -> object:
        return keras.ops.matmul(h, keras.ops.transpose(self.embedding.embeddings))


class Positions(L.Layer):
    """Adds the learned position embedding of each place in the sequence."""

    def build(self, input_shape: tuple[int, ...]) -> None:
        self.table = self.add_weight(shape=(POSITIONS, HIDDEN), initializer="random_normal", name="embeddings")

    def call(self, h: object) -> object:
        return h + self.table[: keras.ops.shape(h)[1]]


def gpt2_small(seq_len: int) -> keras.Model:
    tokens = keras.Input((seq_len,), dtype="int32")
    embed = L.Embedding(VOCAB, HIDDEN, name="wte")
    h = Positions(name="wpe")(embed(tokens))
    for i in range(LAYERS):
        a = L.LayerNormalization(epsilon=1e-5, name=f"h{i}_ln1")(h)
        a = L.MultiHeadAttention(HEADS, HIDDEN // HEADS, name=f"h{i}_attn")(a, a, use_causal_mask=True)
        h = L.Add()([h, a])
        m = L.Dense(4 * HIDDEN, activation="gelu", name=f"h{i}_fc")(L.LayerNormalization(epsilon=1e-5,
                                                                                        name=f"h{i}_ln2")(h))
        h = L.Add()([h, L.Dense(HIDDEN, name=f"h{i}_proj")(m)])
    h = L.LayerNormalization(epsilon=1e-5, name="ln_f")(h)
    return keras.Model(tokens, TiedLogits(embed, name="logits")(h), name="gpt2_small")


def main() -> None:
    mesh = tfl.planner.planned_mesh()
    seq_len = int(mesh.plan["shape"]["seq_len_planned"])
    # Megatron-LM's split: the MLP's first Dense by its units (the mesh's `hidden` rule), the one back to the
    # model width by its inputs, its bias whole; the residual stream then stays whole on every device.
    with mesh.scope(patterns={r"h\d+_proj/kernel": ("m", None), r"h\d+_proj/bias": (None,)}):
        model = gpt2_small(seq_len)
        model.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    batch = mesh.batch_size
    x = rng.integers(0, VOCAB, size=(3 * batch, seq_len), dtype=np.int32)
    y = np.roll(x, -1, axis=1)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    print(f"gpt2_small: {model.count_params():,} parameters on mesh {mesh.layout.mesh_shape}")


if __name__ == "__main__":
    main()
