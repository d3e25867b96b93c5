"""The digits CNN built in Keras 3 and in tf_keras, side by side on the microcontroller path.

Both twins start from the same weights (the tf_keras model's initial weights copied into the Keras 3 one)
and are trained the same way (Adam 1e-3, batch 32, no shuffling, 5 epochs on scikit-learn's digits), each in
its own Keras. Then each is converted in every mode (flatbuffer bytes), and its int8 model runs on the
TFLite Micro interpreter over the test split (accuracy, smallest arena). A third row converts a Keras 3 model
holding the trained tf_keras weights (the same weights exactly: what is left is the conversion).

Targets (issue 38): int8 accuracy on TFLite Micro of the Keras 3 twin within 0.5 points of the tf_keras one;
arena within 5%; only TFLite builtins. Exit status 0 when every target is met.

Run: .venv/bin/python bench/edge_keras3.py
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MODES = ("float32", "dynamic", "float16", "int8", "int16x8")
EPOCHS = 5


def _train(model: Any, keras: Any, split: Any) -> Any:
    model.compile(optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(split.x_train, split.y_train, epochs=EPOCHS, batch_size=32, shuffle=False, verbose=0)
    return model


def _row(label: str, model: Any, split: Any) -> dict[str, Any]:
    from tensorfleet import edge

    start = time.perf_counter()
    artifacts = {mode: edge.convert(model, mode, split.x_train, num_calibration_samples=100, progress=False)
                 for mode in MODES}
    seconds = time.perf_counter() - start
    custom = sorted({op.op for a in artifacts.values() for op in a.graph.operators
                     if op.custom or op.op.startswith("Flex")})
    micro = edge.validate_micro(artifacts["int8"], split.x_test, split.y_test, progress=False)
    return {"label": label, "sizes": {m: a.size for m, a in artifacts.items()}, "ops": artifacts["int8"].ops,
            "custom": custom, "keras": micro.keras_accuracy, "micro": micro.micro_accuracy,
            "arena": micro.arena_bytes, "seconds": seconds}


def main() -> int:
    import keras
    import tf_keras

    from tensorfleet import models
    from tensorfleet.compat.keras import set_random_seed

    split = models.datasets.load_digits()
    set_random_seed(0)
    k2 = models.build("digits_cnn", keras=tf_keras)
    k3 = models.build("digits_cnn", keras=keras)
    k3.set_weights(k2.get_weights())
    _train(k2, tf_keras, split)
    _train(k3, keras, split)
    copied = models.build("digits_cnn", keras=keras)
    copied.set_weights(k2.get_weights())
    rows = [_row("tf_keras", k2, split), _row("keras 3", k3, split), _row("keras 3, tf_keras weights", copied, split)]

    print(f"digits CNN, {len(split.x_test)} test images, {EPOCHS} epochs each from the same initial weights; "
          f"keras {keras.__version__}, tf_keras {tf_keras.__version__}")
    print(f"{'model':<26} {'Keras acc':>9} {'int8 TFLM acc':>13} {'arena B':>8} "
          + " ".join(f"{m:>8}" for m in MODES) + f" {'convert s':>9}  non-builtin ops")
    for r in rows:
        print(f"{r['label']:<26} {r['keras']:>9.4f} {r['micro']:>13.4f} {r['arena']:>8,} "
              + " ".join(f"{r['sizes'][m]:>8,}" for m in MODES) + f" {r['seconds']:>9.1f}  "
              + (", ".join(r["custom"]) or "none"))
    base = rows[0]
    ok = True
    for r in rows[1:]:
        points = 100 * abs(r["micro"] - base["micro"])
        arena = abs(r["arena"] - base["arena"]) / base["arena"]
        met = points <= 0.5 and arena <= 0.05 and not r["custom"] and r["ops"] == base["ops"]
        ok &= met
        print(f"{r['label']}: int8 TFLM accuracy {points:.2f} points from tf_keras (target <= 0.5), arena "
              f"{100 * arena:.1f}% (target <= 5%), ops {'equal' if r['ops'] == base['ops'] else 'differ'}: "
              f"{'met' if met else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
