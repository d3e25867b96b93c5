"""One worker of the 2-worker local SGD test: the user's Keras 3, H=3, 2 epochs of 8 steps; prints counts
and weights as JSON to the file named by argv[1]."""

from __future__ import annotations

import json
import sys


def main(out: str) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.strategies.local_sgd import step_all_reduces

    keras.utils.set_random_seed(0)
    strategy = tfl.strategies.build("multi_worker_mirrored", implementation="ring", timeout_seconds=60)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 6)).astype("float32")
    y = rng.integers(0, 3, size=128).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)  # 8 global batches
    results = {}
    for name, every in (("plain", 0), ("local", 3)):
        with strategy.scope():
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="tanh"),
                                      keras.layers.Dense(3)])
            model.compile(optimizer=keras.optimizers.SGD(0.2, momentum=0.5), metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        callbacks = [tfl.strategies.LocalSGD(every=every, keras=model)] if every else []
        model.fit(data, epochs=2, verbose=0, callbacks=callbacks)
        results[name] = {
            "all_reduces": dict(callbacks[0].all_reduces) if callbacks else {"per_step": step_all_reduces(model)},
            "runs": callbacks[0].runs if callbacks else {},
            "weights": [w.tolist() for w in model.get_weights()]}
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
