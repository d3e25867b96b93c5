"""The main job of ``make demo``: the digits CNN trained with plain Keras ``fit`` under the
``mirrored`` strategy over 2 logical CPU devices, offline; prints accuracy and throughput.

Run with ``python -m tensorfleet.demo [--devices N] [--epochs E]``.
"""

from __future__ import annotations

import argparse
import os
import time

__all__ = ["main", "run"]


def _EpochTimer() -> "object":
    import tensorflow as tf

    class EpochTimer(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []

        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            self.seconds.append(time.perf_counter() - self._start)

    return EpochTimer()


def run(*, devices: int = 2, epochs: int = 5, batch_size: int = 64) -> dict[str, float]:
    """Trains and evaluates; returns test accuracy, examples/s and wall time."""
    import tensorfleet as tfl

    names = tfl.strategies.simulate_devices(devices)
    import tensorflow as tf

    split = tfl.models.datasets.load_digits()
    strategy = tfl.strategies.build("mirrored", devices=names)
    print(f"strategy: mirrored over {strategy.num_replicas_in_sync} logical CPU devices {names}")
    with strategy.scope():
        model = tfl.models.build("digits_cnn")
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-2),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    print(f"model: digits_cnn, {model.count_params():,} parameters; data: scikit-learn digits, "
          f"{len(split.x_train)} train / {len(split.x_test)} test")
    inputs = tfl.strategies.fit_inputs(split.x_train, split.y_train, batch_size=batch_size, strategy=model)
    timer = _EpochTimer()
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
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="logical CPU devices (default 2)")
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs after a warm-up epoch (default 5)")
    args = parser.parse_args(argv)
    if args.devices < 1 or args.epochs < 1:
        parser.error(f"--devices and --epochs must be positive. Received: devices={args.devices}, epochs={args.epochs}")
    run(devices=args.devices, epochs=args.epochs)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
