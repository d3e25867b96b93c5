"""Bytes of parameters and Adam state resident on each device for a small GPT on a mesh.

The small GPT (Embedding, two blocks of MultiHeadAttention + LayerNormalization + MLP, output head)
is built inside ``Mesh.scope()`` on 1, 2 and 4 logical CPUs and compiled with Adam; every byte is
read from the variables themselves: each DVariable's shards (``dtensor.unpack``), the device each
lives on, and its size. Printed per device: parameter bytes, optimizer bytes (Adam's m and v and
its step counter), and the fraction of the one-device total. A split weight must hold 1/m of its
elements on each device (checked, within 2%). ZeRO stages (optimizer-state and gradient sharding
over the batch axis): stage 1 (``Mesh(..., zero=1)``) is measured next to stage 0; stages 2 and 3
are not implemented yet.

Beside each device, the planner's prediction of parameter + optimizer bytes
(:func:`tensorfleet.planner.memory.estimate`, Adam in float32, data parallel over ``b``, tensor
parallel over ``m``, the same ZeRO stage) and measured / predicted. The planner does not count
Adam's 8-byte step counter, and it assumes every weight split over ``m`` (Megatron-LM), whereas
``heads:m`` splits only the attention weights: its ``m`` rows predict less than the mesh holds.

Run: ``python bench/mesh_memory.py`` (add ``--json`` for machine-readable output).
"""

from __future__ import annotations

import argparse
import json
import sys

MESHES = [("one:1", "", 0), ("m:2", "heads:m", 0), ("m:4", "heads:m", 0), ("b:2;m:2", "batch:b;heads:m", 0),
          ("b:2;m:2", "batch:b;heads:m", 1), ("b:4", "batch:b", 0), ("b:4", "batch:b", 1)]


def small_gpt(vocab: int = 64, seq: int = 16, width: int = 32, heads: int = 4) -> object:
    import tensorflow as tf

    layers = tf.keras.layers
    tokens = tf.keras.Input((seq,), dtype="int32", name="tokens")
    h = layers.Embedding(vocab, width, name="embed")(tokens)
    for i in range(2):
        attended = layers.MultiHeadAttention(heads, width // heads, name=f"attention_{i}")(h, h)
        h = layers.LayerNormalization(name=f"norm_{i}a")(layers.Add()([h, attended]))
        mlp = layers.Dense(width, name=f"mlp_{i}_out")(layers.Dense(4 * width, activation="gelu", name=f"mlp_{i}_in")(h))
        h = layers.LayerNormalization(name=f"norm_{i}b")(layers.Add()([h, mlp]))
    return tf.keras.Model(tokens, layers.Dense(vocab, name="head")(h), name="small_gpt")


def resident_bytes(variables: list) -> dict[str, int]:
    """Per device, the bytes of the shards of ``variables`` held there."""
    from tensorflow.experimental import dtensor

    per_device: dict[str, int] = {}
    for variable in variables:
        for shard in dtensor.unpack(variable.read_value()):
            key = shard.device.split("device:")[-1]
            per_device[key] = per_device.get(key, 0) + int(shard.shape.num_elements()) * shard.dtype.size
    return dict(sorted(per_device.items()))


def planned(model: object, mesh_shape: str, zero: int) -> float:
    """The planner's parameter + optimizer bytes per device for ``model`` on ``mesh_shape``."""
    from tensorfleet.planner import memory

    dims = {name: int(size) for name, size in (part.split(":") for part in mesh_shape.split(";"))}
    data, tensor = dims.get("b", 1), dims.get("m", 1)
    parallelism = "hybrid" if data > 1 and tensor > 1 else ("tensor" if tensor > 1 else "data")
    est = memory.estimate(model, batch_size=4, optimizer="adam", precision="float32", parallelism=parallelism,
                          devices=data * tensor, tensor=tensor, zero=zero)
    return est.parameters + est.optimizer_state


def measure(mesh_shape: str, rules: str, zero: int) -> dict:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from tensorfleet.model_parallel.mesh import Mesh

    mesh = Mesh(mesh_shape, rules, zero=zero)
    with mesh.scope() as layout:
        model = small_gpt()
        trainer = mesh.keras_model(model)
        trainer.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if not zero:
        trainer.optimizer.build(model.trainable_variables)
    worst = 0.0
    by_path = {w.path: w for w in layout.decided}
    for variable in model.weights:
        decided = by_path[variable.name.split(":")[0]]
        parts = 1
        for axis in decided.mesh_axes:
            parts *= mesh.layout.mesh_dims[axis] if axis else 1
        shard = int(dtensor.unpack(variable.read_value())[0].shape.num_elements())
        worst = max(worst, abs(shard * parts / variable.shape.num_elements() - 1.0))
    return {"mesh": mesh_shape, "rules": rules, "zero": zero, "devices": mesh.layout.size, "params": model.count_params(),
            "parameter_bytes": resident_bytes(model.weights),
            "optimizer_bytes": resident_bytes(trainer.optimizer.variables),
            "split_weights": sum(w.sharded for w in layout.decided), "weights": len(layout.decided),
            "worst_shard_error": worst, "planned_bytes": planned(model, mesh_shape, zero)}


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
    print(f"small GPT, {rows[0]['params']:,} parameters; bytes resident per device (Adam, float32)")
    print(f"{'mesh':10s} {'rules':16s} {'zero':4s} {'device':8s} {'params':>10s} {'optimizer':>10s} {'of 1 device':>12s} "
          f"{'planner':>10s} {'measured/planner':>17s}")
    for row in rows:
        for device, params in row["parameter_bytes"].items():
            optimizer = row["optimizer_bytes"].get(device, 0)
            print(f"{row['mesh']:10s} {row['rules'] or '-':16s} {row['zero']:<4d} {device:8s} {params:>10,} {optimizer:>10,} "
                  f"{(params + optimizer) / whole:>11.1%} {row['planned_bytes']:>10,.0f} "
                  f"{(params + optimizer) / row['planned_bytes']:>17.4f}")
        print(f"{'':10s} {row['split_weights']} of {row['weights']} weights split; largest deviation of a shard "
              f"from 1/m of its weight: {row['worst_shard_error']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
