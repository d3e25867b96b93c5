"""Parameter-server training of the digits CNN: the chief coordinates, workers and ps serve.

Run it as a local cluster; the launcher starts the workers and ps as servers and runs this
script on the chief only:

    tensorfleet launch --workers 2 --ps 1 --max-restarts 2 examples/train_digits_ps.py -- --epochs 4

Each worker reads its own shard of the training set in its own order (``fit_inputs`` shards by
the worker's index; TensorFlow gives every worker the same ``InputContext``).

When a worker dies, the launcher restarts that worker alone; TensorFlow's
``ClusterCoordinator`` runs the step it lost again on another worker, so every one of the
``epochs * steps_per_epoch`` steps runs at least once. A step whose update had already reached
the parameter server when its worker died is applied twice: with F worker failures the
optimizer counts between ``epochs * steps_per_epoch`` and ``epochs * steps_per_epoch + F``
iterations (the last line prints both).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    # Keras's own fit under a parameter server is Keras 2's (Keras 3 has none: a Keras 3 model trains there as a
    # migratable job, docs/how-to-migrate-a-job.md), so this script is written in tf_keras.
    import tf_keras as keras

    from tensorfleet import strategies
    from tensorfleet.cluster import callback_class
    from tensorfleet.models import build, load_digits

    keras.utils.set_random_seed(args.seed)
    strategy = strategies.build("parameter_server")  # the cluster from the launcher's TF_CONFIG
    split = load_digits(seed=args.seed)

    with strategy.scope():
        model = build("digits_cnn", seed=args.seed, keras="tf_keras")
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    inputs = strategies.fit_inputs(split.x_train, split.y_train, batch_size=args.batch_size, strategy=model,
                                   seed=args.seed, steps_per_epoch=args.steps_per_epoch)
    model.fit(**inputs, epochs=args.epochs, callbacks=[callback_class("EpochLog", model)()], verbose=0)
    logits = model.predict(split.x_test, verbose=0, batch_size=128)
    accuracy = float((logits.argmax(axis=1) == split.y_test).mean())
    print(f"tensorfleet: done iterations={int(model.optimizer.iterations.numpy())} "
          f"planned={args.epochs * args.steps_per_epoch} test_accuracy={accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
