import numpy as np
import pytest

import tensorfleet as tfl
from tensorfleet.models.datasets import load_digits


def test_digits_split_shapes_ranges_and_determinism() -> None:
    split = load_digits()
    assert split.x_train.shape == (1438, 8, 8, 1) and split.x_test.shape == (359, 8, 8, 1)
    assert split.x_train.dtype == np.float32 and split.y_train.dtype == np.int32
    assert float(split.x_train.min()) == 0.0 and float(split.x_train.max()) == 1.0
    assert sorted(np.unique(split.y_train).tolist()) == list(range(10))
    again = load_digits()
    np.testing.assert_array_equal(split.x_train, again.x_train)
    assert not np.array_equal(load_digits(seed=1).y_train, split.y_train)
    assert load_digits(flat=True).x_train.shape == (1438, 64)


def test_bad_test_fraction_is_refused() -> None:
    with pytest.raises(ValueError,
                       match=r"test_fraction must be a finite number > 0 and < 1. Received: test_fraction=1.0"):
        load_digits(test_fraction=1.0)


def test_digits_models_build_with_exact_parameter_counts() -> None:
    cnn = tfl.models.build("digits_cnn")
    # conv 3*3*1*16+16, conv 3*3*16*32+32, dense 4*4*32*64+64, dense 64*10+10
    assert cnn.count_params() == 160 + 4640 + 32832 + 650 == 38282
    assert cnn.output_shape == (None, 10)
    mlp = tfl.models.build("digits_mlp", hidden=32)
    assert mlp.count_params() == 64 * 32 + 32 + 32 * 10 + 10


def test_same_seed_gives_same_initial_weights() -> None:
    a, b = tfl.models.build("digits_cnn", seed=3), tfl.models.build("digits_cnn", seed=3)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)


def test_bad_model_options_and_names_are_refused() -> None:
    with pytest.raises(ValueError, match=r"filters must be a positive integer. Received: filters=0"):
        tfl.models.build("digits_cnn", filters=0)
    with pytest.raises(KeyError, match=r"Unknown model 'digit_cnn'. Did you mean 'digits_cnn'\?"):
        tfl.models.build("digit_cnn")


@pytest.mark.parametrize("name", tfl.models.available())
def test_every_zoo_model_builds_alike_in_keras3_and_tf_keras(name, keras3) -> None:
    from tensorfleet.compat.keras import Keras, keras_of

    small = {"ds_cnn": {"filters": 8}, "mobilenet_v1_025": {"input_shape": (32, 32, 3)}}.get(name, {})
    two, three = (tfl.models.build(name, keras=k, **small) for k in ("tf_keras", "keras3"))
    assert (keras_of(two), keras_of(three)) == (Keras.KERAS2, Keras.KERAS3)
    assert three.count_params() == two.count_params()
    assert tuple(three.output_shape) == tuple(two.output_shape)
    # The same weights give the same outputs in either Keras (float32, another kernel order at most).
    three.set_weights(two.get_weights())
    x = np.random.RandomState(0).rand(2, *two.input_shape[1:]).astype(np.float32)
    np.testing.assert_allclose(three(x, training=False), two(x, training=False), rtol=1e-4, atol=1e-5)


def test_the_zoo_builds_in_the_keras_of_the_process_unless_told(keras3) -> None:
    from tensorfleet.compat.keras import keras_of, user_keras

    assert keras_of(tfl.models.build("digits_mlp")) is user_keras()  # tf_keras in the suite (conftest)
    for which in ("tf_keras", "keras3"):  # a model (it has .layers, like a module) names its own Keras
        model = tfl.models.build("digits_mlp", keras=which)
        assert keras_of(tfl.models.build("digits_cnn", keras=model)) is keras_of(model)
    assert keras_of(tfl.models.build("digits_cnn", keras=keras3)).value == "keras3"  # a module as it is
    with pytest.raises(ValueError, match=r"^keras must be one of 'keras3', 'keras2' \(also 'tf_keras'\), or None for "
                                         r"the Keras tf.keras is in this process\. Received: keras='torch'$"):
        tfl.models.build("digits_mlp", keras="torch")
