"""The main job of ``make demo``, offline, in three parts:

1. strategies: the digits CNN trained with plain Keras ``fit`` under the ``mirrored`` strategy
   over 2 logical CPU devices; prints accuracy and throughput;
2. federated: a short FedAvg simulation of the same model on 20 label-skewed clients on the
   compiled backend (one TensorFlow function per round; no tensorflow-federated needed, so it
   runs on both tracks); prints accuracy per round;
3. edge: the model of part 1 converted to full int8, run on the TFLite Micro interpreter, and
   exported as C sources; prints size, arena and accuracy.

It starts by printing the versions it runs on (Python, TensorFlow, and the Keras behind ``tf.keras``: Keras 3
on TensorFlow >= 2.16 unless the process chose tf_keras). Every part runs in that Keras: part 3 converts a
copy of part 1's model, made outside the strategy, that holds its trained weights. Outputs (metrics, plots, .tflite, C
sources) go to ``--out`` (default ``out/demo``). Run with ``python -m tensorfleet.demo [--devices N] [--epochs E]
[--rounds R] [--out DIR] [--verbose]``; TensorFlow's start-up and converter noise is left out unless ``--verbose``
(:mod:`tensorfleet.cluster.console`).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

__all__ = ["main", "run", "run_federated", "run_edge", "versions"]


def versions() -> str:
    """``Python 3.12.1, TensorFlow 2.21.0, tf_keras 2.21.0 (tf.keras)``: what the demo runs on.

    Importing TensorFlow and reading ``tf.keras`` starts no device, so the logical devices of
    part 1 can still be made afterwards.
    """
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import tensorflow as tf

    from tensorfleet.compat.keras import keras_flavour

    # tf.keras is Keras 3 (TensorFlow >= 2.16), tf_keras (TF_USE_LEGACY_KERAS=1 set by the user) or the keras
    # package 2.14 (TensorFlow 2.14); its module has no version of its own on 2.14, its package does.
    package = "tf_keras" if keras_flavour() == "tf_keras" else "keras"
    try:
        keras = f"{package if package == 'tf_keras' else 'Keras'} {version(package)}"
    except PackageNotFoundError:  # pragma: no cover - tf.keras came from that package, so it is installed
        keras = package
    return f"Python {platform.python_version()}, TensorFlow {tf.__version__}, {keras} (tf.keras)"


def _EpochTimer(keras: Any) -> Any:  # a Keras callback
    class EpochTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []

        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            self.seconds.append(time.perf_counter() - self._start)

    return EpochTimer()


def run(*, devices: int = 2, epochs: int = 5, batch_size: int = 64, return_model: bool = False) -> Any:
    """Trains and evaluates; returns test accuracy, examples/s and wall time (and the model)."""
    import tensorfleet as tfl

    names = tfl.strategies.simulate_devices(devices)
    from tensorfleet.compat.keras import module_of

    split = tfl.models.datasets.load_digits()
    strategy = tfl.strategies.build("mirrored", devices=names)
    print(f"strategy: mirrored over {strategy.num_replicas_in_sync} logical CPU devices {names}")
    with strategy.scope():
        model = tfl.models.build("digits_cnn")  # in the Keras tf.keras is in this process
        keras = module_of(model)
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    print(f"model: digits_cnn, {model.count_params():,} parameters; data: scikit-learn digits, "
          f"{len(split.x_train)} train / {len(split.x_test)} test")
    inputs = tfl.strategies.fit_inputs(split.x_train, split.y_train, batch_size=batch_size, strategy=model)
    timer = _EpochTimer(keras)
    model.fit(**inputs, epochs=epochs + 1, verbose=2, callbacks=[timer])
    seconds = sum(timer.seconds[1:])  # the first epoch also traces and builds the graph
    result = model.evaluate(**tfl.strategies.evaluate_inputs(split.x_test, split.y_test, batch_size=batch_size,
                                                              strategy=model), verbose=0, return_dict=True)
    summary = {
        "test_accuracy": float(result["accuracy"]),
        "examples_per_second": len(split.x_train) * epochs / seconds,
        "train_seconds": seconds,
    }
    print(f"test accuracy: {summary['test_accuracy']:.4f}")
    print(f"throughput: {summary['examples_per_second']:,.0f} examples/s "
          f"({epochs} epochs in {seconds:.1f} s after a warm-up epoch)")
    return (summary, model) if return_model else summary


def run_federated(*, rounds: int = 10, out_dir: str = "out/demo/federated") -> dict[str, float]:
    """A short FedAvg run on 20 Dirichlet(0.5) clients of digits on the compiled backend; returns the
    final accuracy."""
    import tensorfleet as tfl

    split = tfl.models.datasets.load_digits()
    clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=20, scheme="dirichlet",
                                      alpha=0.5, seed=0)
    sim = tfl.federated.Simulation(
        lambda: tfl.models.build("digits_cnn"), clients, "fedavg", rounds=rounds, clients_per_round=5, seed=0,
        local_epochs=2, client_learning_rate=0.1, backend="compiled",
        test_data=(split.x_test, split.y_test), eval_every=1, out_dir=out_dir)
    history = sim.run()
    accuracy = float(history.final("test_accuracy"))
    print(f"federated: {sim.header()}, 20 clients, 5 per round, {rounds} rounds: central test accuracy {accuracy:.4f}; "
          f"metrics and plots in {out_dir}")
    return {"test_accuracy": accuracy}


def run_edge(model: Any, *, out_dir: str = "out/demo/edge") -> dict[str, float]:
    """Full-int8 conversion of ``model``, TFLite Micro validation and C export."""
    from pathlib import Path

    import tensorfleet as tfl

    split = tfl.models.datasets.load_digits()
    plain = tfl.models.build("digits_cnn", keras=model)  # part 1's weights, outside the strategy, in its Keras
    plain.set_weights(model.get_weights())
    artifact = tfl.edge.convert(plain, quantization="int8", representative_data=split.x_train[:200])
    artifact.save(Path(out_dir) / "digits_int8.tflite")
    validation = tfl.edge.validate_micro(artifact, split.x_test, split.y_test)
    assert validation.micro_accuracy is not None  # labels were given
    files = tfl.edge.export_c(artifact, Path(out_dir) / "c", name="digits", arena_bytes=validation.arena_bytes)
    print(f"edge: int8 model {len(artifact.data):,} bytes, smallest TFLite Micro arena "
          f"{validation.arena_bytes:,} bytes, accuracy on TFLite Micro {validation.micro_accuracy:.4f} "
          f"(Keras {validation.keras_accuracy:.4f}); C sources: {', '.join(str(f) for f in files)}")
    return {"bytes": float(len(artifact.data)), "arena_bytes": float(validation.arena_bytes),
            "micro_accuracy": float(validation.micro_accuracy)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="logical CPU devices (default 2)")
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs after a warm-up epoch (default 5)")
    parser.add_argument("--rounds", type=int, default=10, help="federated rounds (default 10)")
    parser.add_argument("--out", default="out/demo", help="where outputs go (default out/demo)")
    parser.add_argument("--verbose", action="store_true", help="also show TensorFlow's logs and start-up lines")
    args = parser.parse_args(argv)
    if args.devices < 1 or args.epochs < 1 or args.rounds < 1:
        parser.error("--devices, --epochs and --rounds must be positive. Received: "
                     f"devices={args.devices}, epochs={args.epochs}, rounds={args.rounds}")
    from tensorfleet.cluster.console import quiet_stderr

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if args.verbose else "2")  # before TensorFlow starts
    with quiet_stderr(enabled=not args.verbose):
        print(f"tensorfleet demo on {versions()}")
        print("== 1. strategies: plain Keras fit under a distribution strategy")
        _, model = run(devices=args.devices, epochs=args.epochs, return_model=True)
        print("== 2. federated: FedAvg on the compiled backend")
        run_federated(rounds=args.rounds, out_dir=f"{args.out}/federated")
        print("== 3. edge: int8 for a microcontroller, checked on TFLite Micro")
        run_edge(model, out_dir=f"{args.out}/edge")


if __name__ == "__main__":
    main()
