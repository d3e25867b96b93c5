"""A small parameter-server training script, run by test_parameter_server.py under ``tensorfleet launch``.

Every task runs it: the workers and the ps task serve (``strategies.build`` blocks there), the chief
trains an MLP on synthetic data with Adam for ``STEPS`` steps of one epoch.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STEPS = 24


def main() -> None:
    import numpy as np
    import tensorflow as tf

    from tensorfleet import strategies

    strategy = strategies.build("parameter_server")
    rng = np.random.default_rng(0)
    x, y = rng.random((1024, 32), dtype=np.float32), rng.integers(0, 10, 1024)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(**strategies.fit_inputs(x, y, batch_size=32, strategy=model, steps_per_epoch=STEPS), epochs=1, verbose=0)
    print(f"iterations={int(model.optimizer.iterations.numpy())}", flush=True)


if __name__ == "__main__":
    main()
