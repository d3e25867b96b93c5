"""tensorfleet's mirrored strategy vs raw tf.distribute.MirroredStrategy, side by side.

Same model (digits_cnn, same seed), same data, same 2 logical CPU devices; the two contenders
alternate ROUNDS times in one process, each timing EPOCHS epochs after a warm-up epoch (median epoch time).
Prints examples/s of each round, the medians, their ratio and the median of the per-round
ratios (target >= 0.98). ``--keras`` picks the Keras the model is written in: ``keras3`` (``import keras``,
what a user of TensorFlow 2.21 writes), ``tf_keras``, or ``both`` (the default where both are installed:
one comparison for each, in the same process).

Run: .venv/bin/python bench/strategy_overhead.py [--rounds 5] [--epochs 3] [--keras both|keras3|tf_keras]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def throughput(strategy, split, epochs: int, keras_name: str, batch_size: int = 64) -> float:
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.compat.keras import keras_module

    keras = keras_module(keras_name)
    with strategy.scope():
        model = tfl.models.build("digits_cnn", seed=0, keras=keras_name)
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset = tf.data.Dataset.from_tensor_slices((split.x_train, split.y_train)).shuffle(
        len(split.x_train), seed=0).batch(batch_size).prefetch(2)
    seconds: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds.append(time.perf_counter() - self.start)

    model.fit(dataset, epochs=epochs + 1, verbose=0, callbacks=[EpochTimer()], shuffle=False)
    # The first epoch also traces and builds the graph; the rest is steady-state training.
    return len(split.x_train) / statistics.median(seconds[1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--keras", default="both", choices=["both", "keras3", "tf_keras"],
                        help="the Keras the model is written in (default: both, one after the other)")
    args = parser.parse_args()

    import tensorfleet as tfl

    devices = tfl.strategies.simulate_devices(2)
    import tensorflow as tf

    split = tfl.models.datasets.load_digits()
    contenders = {
        "raw tf.distribute.MirroredStrategy": lambda: tf.distribute.MirroredStrategy(devices=devices),
        "tensorfleet build('mirrored')": lambda: tfl.strategies.build("mirrored", devices=devices),
    }
    for keras_name in (["keras3", "tf_keras"] if args.keras == "both" else [args.keras]):
        compare(contenders, split, args.rounds, args.epochs, keras_name)


def compare(contenders: dict, split, rounds: int, epochs: int, keras_name: str) -> None:
    from tensorfleet.compat.keras import keras_module

    keras = keras_module(keras_name)
    print(f"== the digits CNN in {keras.__name__} {keras.__version__}")
    results: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(rounds):
        order = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
        for name in order:
            results[name].append(throughput(contenders[name](), split, epochs, keras_name))
        print(f"round {round_ + 1}: " + ", ".join(f"{n}: {results[n][-1]:,.0f} ex/s" for n in contenders))
    medians = {name: statistics.median(values) for name, values in results.items()}
    raw, ours = medians.values()
    for name, value in medians.items():
        print(f"median {name}: {value:,.0f} examples/s")
    # Each round runs both back to back, so a round's ratio cancels the load swings between rounds.
    paired = [b / a for a, b in zip(*results.values())]
    print(f"ratio of medians tensorfleet / raw ({keras_name}): {ours / raw:.3f}")
    print(f"median of per-round ratios tensorfleet / raw ({keras_name}): {statistics.median(paired):.3f} "
          "(target >= 0.98)")


if __name__ == "__main__":
    main()
