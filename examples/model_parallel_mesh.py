"""Train the small transformer block on 8x8 digits under a 2x2 Mesh-TensorFlow layout.

Runs the same layout three times from the same initial weights, each the one way in (the model
built and compiled inside ``mesh.scope()``, then its own ``fit``): as a Mesh-TF graph
(PlacementMeshImpl), with tensorfleet's tensor-parallel Keras layers, and with the weights as
DTensor DVariables; prints each loss curve and the test accuracy of each trained Keras model.

Usage:
    python examples/model_parallel_mesh.py [--model transformer_block|digits_mlp] [--epochs 3]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer_block", choices=["transformer_block", "digits_mlp"])
    parser.add_argument("--mesh-shape", default="b1:2;b2:2")
    parser.add_argument("--layout", default="batch:b1;hidden:b2;heads:b2")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.2)
    args = parser.parse_args(argv)

    import tensorfleet as tfl

    tfl.strategies.simulate_devices(4)
    import numpy as np
    import tf_keras as keras  # the mesh runs Keras 2 (tf_keras) models for now: see docs/keras.md

    from tensorfleet.model_parallel import Mesh

    split = tfl.models.load_digits(flat=args.model == "digits_mlp")
    x_train, x_test = split.x_train, split.x_test
    if args.model == "transformer_block":
        x_train, x_test = x_train[..., 0], x_test[..., 0]  # 8 rows of 8 pixels
    layout = args.layout if args.model == "transformer_block" else args.layout.replace(";heads:b2", "")
    # As the mtf and keras backends lay out the transformer block: the model width (d_model) whole, the MLP's
    # second Dense split by rows (Megatron); the dtensor backend reads these patterns beside the rules.
    model_axis = args.layout.split("hidden:")[1].split(";")[0] if "hidden:" in args.layout else None
    patterns = {"embed/kernel": (None, None), "embed/bias": (None,), "mlp_out/kernel": (model_axis, None),
                "mlp_out/bias": (None,)}
    for backend in ("mtf", "keras", "dtensor"):
        mesh = Mesh(args.mesh_shape, layout, backend=backend)
        with mesh.scope(patterns=patterns):  # the one way in, on every backend: build and compile inside, then fit
            model = tfl.models.build(args.model, keras="tf_keras")
            model.compile(optimizer=keras.optimizers.SGD(args.learning_rate),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x_train, split.y_train, epochs=args.epochs, batch_size=args.batch_size, shuffle=False,
                            verbose=0)
        accuracy = float(np.mean(np.argmax(model.predict(x_test, verbose=0), axis=1) == split.y_test))
        print(f"{backend:>5}: mesh {args.mesh_shape!r} layout {layout!r} on {mesh.layout.size} devices; "
              f"epoch losses {[round(v, 4) for v in history.history['loss']]}; test accuracy {accuracy:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
