"""MLPerf Tiny reference models: shapes, generated data, and int8 arenas against the published ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tensorfleet import edge, models
from tensorfleet.compat.keras import keras2
from tensorfleet.models import tinyml

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)

NAMES = ("ds_cnn", "resnet8", "anomaly_autoencoder", "mobilenet_v1_025")


@pytest.fixture(scope="module")
def int8_tinyml() -> Callable[[str], Any]:
    """Name -> the model's full-int8 artifact, converted the first time a test asks (the unit tier asks for the
    DS-CNN only; the arena tests, marked slow, for all four)."""
    converted: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in converted:
            data = tinyml.synthetic(name, n=4)
            # tf_keras, the Keras the reference op sets and arenas below were measured with (Keras 3 drops a RESHAPE)
            converted[name] = edge.convert(models.build(name, keras="tf_keras"), "int8", data.x, progress=False)
        return converted[name]

    return get


def test_models_are_registered_with_reference_shapes() -> None:
    expected = {"ds_cnn": ((None, 49, 10, 1), (None, 12)), "resnet8": ((None, 32, 32, 3), (None, 10)),
                "anomaly_autoencoder": ((None, 640), (None, 640)),
                "mobilenet_v1_025": ((None, 96, 96, 3), (None, 2))}
    for name, (inp, out) in expected.items():
        model = models.build(name)
        assert (model.input_shape, model.output_shape) == (inp, out)
    assert models.MODELS.canonical("kws") == "ds_cnn" and models.MODELS.canonical("vww") == "mobilenet_v1_025"


def test_ds_cnn_architecture() -> None:

    model = models.build("ds_cnn", keras="tf_keras")
    depthwise = [layer for layer in model.layers if isinstance(layer, tf_keras.layers.DepthwiseConv2D)]
    convs = [layer for layer in model.layers if type(layer) is tf_keras.layers.Conv2D]
    assert len(depthwise) == 4 and len(convs) == 5
    assert {layer.filters for layer in convs} == {64}
    assert convs[0].kernel_size == (10, 4) and convs[0].strides == (2, 2)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_int8_arena_within_five_percent_of_the_published_reference(name: str,
                                                                   int8_tinyml: Callable[[str], Any]) -> None:
    arena = edge.find_arena_size(int8_tinyml(name), progress=False)
    reference = tinyml.REFERENCE[name].arena_bytes
    assert abs(arena - reference) <= 0.05 * reference, (name, arena, reference)


def test_int8_ds_cnn_is_fully_integer_with_the_reference_ops(int8_tinyml: Callable[[str], Any]) -> None:
    artifact = int8_tinyml("ds_cnn")
    edge.verify_int8(artifact)
    assert artifact.op_types == ("AVERAGE_POOL_2D", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "RESHAPE",
                                 "SOFTMAX")
    assert artifact.ops.count("DEPTHWISE_CONV_2D") == 4


def test_synthetic_data_is_shaped_seeded_and_learnable_by_shape() -> None:
    a, b = tinyml.synthetic("kws", n=6, seed=1), tinyml.synthetic("kws", n=6, seed=1)
    assert a.x.shape == (6, 49, 10, 1) and a.y.dtype == np.int32
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    images = tinyml.synthetic("resnet8", n=5)
    assert images.x.min() >= 0.0 and images.x.max() <= 1.0
    frames = tinyml.synthetic("anomaly_autoencoder", n=3)
    assert frames.x.shape == (3, 640) and frames.y is None
    with pytest.raises(ValueError, match=r"synthetic\(\) has data for .* Received: name='digits_cnn'"):
        tinyml.synthetic("digits_cnn")
    with pytest.raises(ValueError, match="n must be a positive integer. Received: n=0"):
        tinyml.synthetic("kws", n=0)
