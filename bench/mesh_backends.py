"""Mesh backends side by side: time per training step on a 2x2 mesh against one device.

For the ``digits_mlp`` and ``transformer_block`` models, trains with plain SGD on 4 logical
CPU devices under the layout ``batch:b1;hidden:b2(;heads:b2)`` with each backend (mtf,
keras, dtensor) and on one device (a ``tf.function`` SGD step), alternating the contenders
``--repeats`` times in one run. Each run trains 2 epochs; a contender's time per step is the
median wall time of the second epoch's steps (``MeshHistory.step_seconds``), which leaves out
graph building and tracing. Prints the median over runs and its ratio to one device. Logical
devices share the machine's cores: this measures the overhead of splitting, not a speed-up.
The models are tf_keras ones, whatever ``tf.keras`` is in the process: the mtf and keras
backends take tf_keras models only.

Usage:
    python bench/mesh_backends.py [--repeats 3] [--examples 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def one_device_seconds(name: str, x, y, steps: int, batch_size: int) -> list[float]:
    """Seconds of each step of 2 epochs of ``name`` on one device (a ``tf.function`` SGD step)."""
    import tensorflow as tf
    import tf_keras

    import tensorfleet as tfl

    model = tfl.models.build(name, keras="tf_keras")
    optimizer = tf_keras.optimizers.SGD(0.1)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    seconds = []
    with tf.device("/CPU:0"):
        for _ in range(2):
            for s in range(steps):
                start = time.perf_counter()
                float(step(x[s * batch_size:(s + 1) * batch_size], y[s * batch_size:(s + 1) * batch_size]))
                seconds.append(time.perf_counter() - start)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)

    from tensorfleet.strategies.devices import simulate_devices

    simulate_devices(4)
    from tqdm.auto import tqdm

    import tensorfleet as tfl
    from tensorfleet.model_parallel.mesh import Mesh

    steps = args.examples // args.batch_size
    cases = {"digits_mlp": "batch:b1;hidden:b2", "transformer_block": "batch:b1;hidden:b2;heads:b2"}
    contenders = ["one_device", "mtf", "keras", "dtensor"]
    times: dict[tuple[str, str], list[float]] = {}

    total = len(cases) * len(contenders) * args.repeats
    with tqdm(total=total, desc="mesh_backends") as bar:
        for name, layout in cases.items():
            split = tfl.models.datasets.load_digits(flat=name == "digits_mlp")
            x = split.x_train[: args.examples] if name == "digits_mlp" else split.x_train[: args.examples, ..., 0]
            y = split.y_train[: args.examples]
            for _ in range(args.repeats):
                for who in contenders:
                    if who == "one_device":
                        seconds = one_device_seconds(name, x, y, steps, args.batch_size)
                    else:
                        model = tfl.models.build(name, keras="tf_keras")
                        seconds = Mesh("b1:2;b2:2", layout, backend=who).fit(
                            model, x, y, epochs=2, batch_size=args.batch_size, learning_rate=0.1,
                            verbose=False).step_seconds
                    times.setdefault((name, who), []).append(statistics.median(seconds[steps:]))
                    bar.update(1)

    print(f"mesh backends, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, 2x2 mesh on 4 logical CPU devices, "
          f"batch {args.batch_size}, median of {args.repeats} alternating runs; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'model':<18} {'contender':<11} {'ms/step':>8} {'x one device':>13}")
    for name in cases:
        base = statistics.median(times[(name, "one_device")])
        for who in contenders:
            median = statistics.median(times[(name, who)])
            print(f"{name:<18} {who:<11} {1000 * median:>8.2f} {median / base:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
