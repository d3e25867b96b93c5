"""The planner's memory model (and its per-weight form) refuses a Keras 3 model (installed beside tf_keras on the
current track) with one
error naming the fix, instead of counting a model whose layers it cannot read."""

from __future__ import annotations

import pytest

from tensorfleet.compat.keras import Keras3ModelError
from tensorfleet.planner import memory, splits


def test_memory_estimate_refuses_a_keras3_model():
    import tensorflow as tf  # noqa: F401  (Keras 3's TensorFlow backend)

    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3."):
        pytest.skip(f"Keras 3 is not installed here (keras {keras.__version__}: the tff track)")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(Keras3ModelError, match=r"^the planner's memory model runs Keras 2 \(tf_keras\) models only for "
                                               r"now, and received a Keras 3 model .*tf_keras"):
        memory.estimate(model, batch_size=4)
    with pytest.raises(Keras3ModelError, match=r"^the planner's memory model runs Keras 2 \(tf_keras\) models only for "
                                               r"now, and received a Keras 3 model"):
        memory.layer_table(model)
    with pytest.raises(Keras3ModelError, match=r"^the planner's memory model runs Keras 2 \(tf_keras\) models only for "
                                               r"now, and received a Keras 3 model"):
        splits.estimate(model, [splits.WeightSplit(8), splits.WeightSplit(2)], batch_size=4)
