"""One worker of a 2-process job under ``tensorfleet launch --workers 2``, run by test_compression_launch.py.

Trains the digits CNN under multi_worker_mirrored with ``compression=`` (argv[1]) and writes, per worker, what
its steps handed the collective and its final weights to ``argv[2]/worker<i>.npz``.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(method: str, out_dir: str) -> None:
    import numpy as np
    import tensorflow as tf

    import tensorfleet as tfl
    from tensorfleet.strategies import compression

    keras = tf.keras  # the user's Keras (Keras 3 in a user's process)
    strategy = tfl.strategies.build("multi_worker_mirrored", implementation="ring", timeout_seconds=120,
                                    compression=method)
    data = tfl.models.datasets.load_digits()
    with strategy.scope():
        model = tfl.models.build("digits_cnn")
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = [w.copy() for w in model.get_weights()]
    model.fit(**tfl.strategies.fit_inputs(data.x_train[:512], data.y_train[:512], batch_size=64, strategy=model),
              epochs=2, verbose=0)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    weights = model.get_weights()
    np.savez(os.path.join(out_dir, f"worker{task}.npz"), *weights,
             traffic=json.dumps(compression.traffic(strategy).as_dict()),
             moved=np.array([not np.array_equal(a, b) for a, b in zip(start, weights)]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
