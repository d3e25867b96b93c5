"""Bytes of parameters, gradients and Adam state resident on each device for a small GPT on a mesh.

The small GPT (Embedding, two blocks of MultiHeadAttention + LayerNormalization + MLP, output head)
is built inside ``Mesh.scope()`` on 1, 2 and 4 logical CPUs and compiled with Adam; every byte is
read from the tensors themselves: each DVariable's shards (``dtensor.unpack``), the device each
lives on, and its size. Gradients are those one training step keeps between computing and applying
them (``MeshTrainer.step_gradients``, one batch of 8). Printed per device: parameter, gradient and
optimizer bytes (Adam's m and v and its step counter), and the fraction of the one-device total of
parameters + optimizer state. A split weight must hold 1/parts of its elements on each device
(checked, within 2%). Every ZeRO stage (``Mesh(..., zero=0..3)``) over the batch axis ``b``.

Beside each device, the planner's prediction (:func:`tensorfleet.planner.splits.estimate`, Adam
in float32, the same ZeRO stage) from ``Mesh.weight_splits(model)``: the weights as the mesh's own
layout decisions split them (``heads:m`` splits the attention weights only; the layout keeps the
embedding table and the Dense layers over sequences whole), not the Megatron-LM assumption that
every weight is split. measured / planner for parameters + optimizer state and for all three; the
planner does not count Adam's 8-byte step counter.

Run: ``python bench/mesh_memory.py`` (add ``--json`` for machine-readable output).
"""

from __future__ import annotations

import argparse
import json
import sys

MESHES = [("one:1", "", 0), ("m:2", "heads:m", 0), ("m:4", "heads:m", 0), ("m:4", "hidden:m;heads:m;vocab:m", 0),
          *[("b:2", "batch:b", z) for z in range(4)], *[("b:2;m:2", "batch:b;heads:m", z) for z in range(4)],
          *[("b:4", "batch:b", z) for z in range(4)], ("b:2;m:2", "batch:b;hidden:m;heads:m;vocab:m", 3)]
BATCH = 8


def small_gpt(vocab: int = 64, seq: int = 16, width: int = 32, heads: int = 4) -> object:
    """The small GPT in tf_keras (Keras 2): ZeRO on a mesh trains tf_keras models only."""
    import tf_keras

    layers = tf_keras.layers
    tokens = tf_keras.Input((seq,), dtype="int32", name="tokens")
    h = layers.Embedding(vocab, width, name="embed")(tokens)
    for i in range(2):
        attended = layers.MultiHeadAttention(heads, width // heads, name=f"attention_{i}")(h, h)
        h = layers.LayerNormalization(name=f"norm_{i}a")(layers.Add()([h, attended]))
        mlp = layers.Dense(width, name=f"mlp_{i}_out")(
            layers.Dense(4 * width, activation="gelu", name=f"mlp_{i}_in")(h))
        h = layers.LayerNormalization(name=f"norm_{i}b")(layers.Add()([h, mlp]))
    return tf_keras.Model(tokens, layers.Dense(vocab, name="head")(h), name="small_gpt")


def resident_bytes(variables: list) -> dict[str, int]:
    """Per device, the bytes of the shards of ``variables`` held there."""
    from tensorflow.experimental import dtensor

    per_device: dict[str, int] = {}
    for variable in variables:
        for shard in dtensor.unpack(variable.read_value() if hasattr(variable, "read_value") else variable):
            key = shard.device.split("device:")[-1]
            per_device[key] = per_device.get(key, 0) + int(shard.shape.num_elements()) * shard.dtype.size
    return dict(sorted(per_device.items()))


def planned(mesh: object, model: object, zero: int) -> dict[str, float]:
    """The planner's parameter, gradient and optimizer bytes per device for ``model`` as ``mesh`` lays it out."""
    from tensorfleet.planner import splits

    dims = mesh.layout.mesh_dims
    data, tensor = dims.get("b", 1), mesh.layout.size // dims.get("b", 1)
    parallelism = "hybrid" if data > 1 and tensor > 1 else ("tensor" if tensor > 1 else "data")
    est = splits.estimate(model, mesh.weight_splits(model), batch_size=BATCH, optimizer="adam", precision="float32",
                          parallelism=parallelism, devices=mesh.layout.size, tensor=tensor, zero=zero)
    return {"parameters": est.parameters, "gradients": est.gradients, "optimizer_state": est.optimizer_state}


def measure(mesh_shape: str, rules: str, zero: int) -> dict:
    import numpy as np
    import tf_keras
    from tensorflow.experimental import dtensor

    from tensorfleet.model_parallel.mesh import Mesh
    from tensorfleet.planner.splits import split_fraction

    mesh = Mesh(mesh_shape, rules, zero=zero)
    with mesh.scope():
        model = small_gpt()
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-3),
                      loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if not zero:
        model.optimizer.build(model.trainable_variables)
    worst = 0.0
    for variable in model.weights:  # each shard against 1/parts of the weight, parts from its stored layout
        parts = 1
        for axis in variable.layout.sharding_specs:
            parts *= mesh.layout.mesh_dims[axis] if axis != dtensor.UNSHARDED else 1
        shard = int(dtensor.unpack(variable.read_value())[0].shape.num_elements())
        worst = max(worst, abs(shard * parts / variable.shape.num_elements() - 1.0))
    tokens = np.random.RandomState(0).randint(0, 64, (BATCH, 16)).astype("int32")
    grads = [g for g in model.mesh_trainer.step_gradients(tokens, np.roll(tokens, -1, axis=1)) if g is not None]
    weights = mesh.weight_splits(model)
    return {"mesh": mesh_shape, "rules": rules, "zero": zero, "devices": mesh.layout.size,
            "params": model.count_params(),
            "parameter_bytes": resident_bytes(model.weights), "gradient_bytes": resident_bytes(grads),
            "optimizer_bytes": resident_bytes(model.optimizer.variables),
            "split_weights": sum(w.parts > 1 for w in weights), "weights": len(weights),
            "split_fraction": split_fraction(weights), "worst_shard_error": worst,
            "planned": planned(mesh, model, zero)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    args = parser.parse_args(argv)
    from tensorfleet.strategies.devices import simulate_devices

    simulate_devices(4)
    rows = [measure(shape, rules, zero) for shape, rules, zero in MESHES]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    whole = sum(rows[0]["parameter_bytes"].values()) + sum(rows[0]["optimizer_bytes"].values())
    print(f"small GPT, {rows[0]['params']:,} parameters; bytes resident per device (Adam, float32; gradients of a "
          f"batch of {BATCH})")
    print(f"{'mesh':8s} {'rules':33s} {'zero':4s} {'device':7s} {'params':>8s} {'grads':>8s} {'optimizer':>9s} "
          f"{'of 1 dev':>8s} {'planner p+o':>11s} {'meas/plan':>9s} {'planner all':>11s} {'meas/plan':>9s}")
    for row in rows:
        plan = row["planned"]
        for device, params in row["parameter_bytes"].items():
            grads, optimizer = row["gradient_bytes"].get(device, 0), row["optimizer_bytes"].get(device, 0)
            p_o = plan["parameters"] + plan["optimizer_state"]
            print(f"{row['mesh']:8s} {row['rules'] or '-':33s} {row['zero']:<4d} {device:7s} {params:>8,} {grads:>8,} "
                  f"{optimizer:>9,} {(params + optimizer) / whole:>8.1%} {p_o:>11,.0f} "
                  f"{(params + optimizer) / p_o:>9.4f} {p_o + plan['gradients']:>11,.0f} "
                  f"{(params + grads + optimizer) / (p_o + plan['gradients']):>9.4f}")
        print(f"{'':8s} {row['split_weights']} of {row['weights']} weights ({row['split_fraction']:.1%} of the "
              f"parameters) split by the layout; largest deviation of a shard from 1/parts of its weight: "
              f"{row['worst_shard_error']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
