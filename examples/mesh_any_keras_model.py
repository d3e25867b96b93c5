"""A Keras model of many layer kinds trained with plain ``fit`` on a 2x2 mesh of logical CPUs, next to
the same model on one device: which weight each layer split, and how far the two runs end apart.

Layers: Embedding, Conv1D, Add (skip connections), LayerNormalization, MultiHeadAttention, Dropout,
Dense over the sequence with gelu/swish, BatchNormalization, MaxPooling1D, AveragePooling1D,
Concatenate, Flatten and a softmax output. One device draws Dropout's masks from Keras'
``tf.random.Generator`` as the mesh does, so the two runs see the same masks.

Measured (5 steps): the losses agree to 1e-6 and every weight to 4e-7 but the attention's key bias
(1.6e-5), whose true gradient is 0 (a softmax does not change when every score of a row moves by
the same amount): Adam divides that rounding noise by its own size, on either side.

Run: ``python examples/mesh_any_keras_model.py [--steps 5]``
"""

from __future__ import annotations

import argparse


def build(vocab: int = 32, seq: int = 8, width: int = 16) -> object:
    import tf_keras as keras  # the mesh runs Keras 2 (tf_keras) models for now: see docs/keras.md

    layers = keras.layers
    keras.utils.set_random_seed(7)
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    h = layers.Embedding(vocab, width, name="embed")(tokens)
    h = layers.LayerNormalization(name="ln0")(
        layers.Add()([h, layers.Conv1D(width, 3, padding="same", name="conv")(h)]))
    attended = layers.MultiHeadAttention(4, width // 4, name="attention")(h, h)
    h = layers.LayerNormalization(name="ln1")(layers.Add()([h, layers.Dropout(0.2, seed=1, name="drop")(attended)]))
    mlp = layers.Dense(width, activation="swish", name="mlp_out")(layers.Dense(2 * width, activation="gelu",
                                                                              name="mlp_in")(h))
    h = layers.BatchNormalization(name="bn")(layers.Add()([h, mlp]))
    pooled = layers.Concatenate(name="both")([layers.MaxPooling1D(2)(h), layers.AveragePooling1D(2)(h)])
    return keras.Model(tokens, layers.Dense(10, activation="softmax", name="probs")(layers.Flatten()(pooled)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="Adam steps of 16 examples")
    args = parser.parse_args(argv)
    from tensorfleet.strategies import simulate_devices

    simulate_devices(4)
    import numpy as np
    import tf_keras as keras

    from tensorfleet.model_parallel import Mesh

    x = np.random.RandomState(0).randint(0, 32, (16 * args.steps, 8)).astype("int32")
    y = x.sum(axis=1) % 10
    keras.backend.experimental.enable_tf_random_generator()
    one = build()
    initial = one.get_weights()
    one.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    one_loss = one.fit(x, y, batch_size=16, shuffle=False, verbose=0).history["loss"][-1]

    mesh = Mesh("b:2;m:2", "batch:b;hidden:m;heads:m;channels:m")
    # The MLP's second Dense split by rows (Megatron's row parallelism): its output, which pooling reads,
    # is then whole along m; DTensor pools only tensors split along the batch alone.
    with mesh.scope(patterns={"mlp_out/kernel": ("m", None), "mlp_out/bias": (None,)}) as layout:
        model = build()
        model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    model.set_weights(initial)
    mesh_loss = model.fit(x, y, batch_size=16, shuffle=False, verbose=0).history["loss"][-1]
    print(layout.summary())
    apart = sorted(((float(np.abs(a - b).max()), v.name) for a, b, v in zip(model.get_weights(), one.get_weights(),
                                                                          model.weights)), reverse=True)
    print(f"loss: one device {one_loss:.6f}, mesh {mesh_loss:.6f}; largest weight differences: "
          + ", ".join(f"{name} {diff:.2e}" for diff, name in apart[:3]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
