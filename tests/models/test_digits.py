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
    with pytest.raises(ValueError, match=r"test_fraction must be a finite number > 0 and < 1. Received: test_fraction=1.0"):
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
