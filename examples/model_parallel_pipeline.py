"""Train an MLP on 8x8 digits as a 4-stage pipeline and draw its schedule.

Splits a deep MLP into stages balanced by parameter count on 4 logical devices (each stage's
weights created on its device), trains it
with the chosen schedule, and saves the Gantt chart of the last step as a PNG.

Usage:
    python examples/model_parallel_pipeline.py [--schedule gpipe|1f1b|interleaved] [--out schedule.png]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved"])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--virtual-stages", type=int, default=None, help="default: 2 for interleaved, else 1")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", default="pipeline_schedule.png")
    parser.add_argument("--seed", type=int, default=0, help="seeds the initial weights and the shuffling")
    args = parser.parse_args(argv)

    import tensorfleet as tfl

    tfl.strategies.simulate_devices(4)
    import numpy as np
    import tf_keras as keras  # pipelines run Keras 2 (tf_keras) models for now: see docs/keras.md

    from tensorfleet.model_parallel import Pipeline

    keras.utils.set_random_seed(args.seed)

    split = tfl.models.load_digits(flat=True)
    model = keras.Sequential([keras.layers.Dense(64, activation="relu") for _ in range(7)] +
                             [keras.layers.Dense(10)], name="deep_mlp")
    v = args.virtual_stages or (2 if args.schedule == "interleaved" else 1)
    # Not built yet: the pipeline builds each stage's layers on that stage's device.
    pipe = Pipeline(model, num_stages=args.stages, micro_batches=args.micro_batches, schedule=args.schedule,
                    virtual_stages=v, input_shape=(64,))
    history = pipe.fit(split.x_train, split.y_train, optimizer=keras.optimizers.Adam(3e-3),
                       epochs=args.epochs, batch_size=64)
    accuracy = float(np.mean(np.argmax(model.predict(split.x_test, verbose=0), axis=1) == split.y_test))
    step = pipe.compute_gradients(split.x_train[:64], split.y_train[:64])
    path = pipe.plot(step.events, args.out)
    print(f"{args.schedule}: {len(pipe.stages)} stages of {[len(s) for s in pipe.stages]} layers on "
          f"{pipe.num_devices} devices; epoch losses {[round(x, 4) for x in history['loss']]}; "
          f"test accuracy {accuracy:.3f}; bubble {step.bubble_fraction:.1%}; peak activations "
          f"{step.peak_activations}; schedule plot {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
