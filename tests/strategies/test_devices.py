import pytest

import tensorfleet as tfl


def test_same_split_again_is_a_no_op(logical_cpus) -> None:
    assert tfl.strategies.simulate_devices(4) == logical_cpus == [f"/device:CPU:{i}" for i in range(4)]


def test_split_after_runtime_start_raises_clear_error(logical_cpus) -> None:
    with pytest.raises(tfl.strategies.RuntimeAlreadyInitializedError) as info:
        tfl.strategies.simulate_devices(2)
    assert str(info.value).startswith(
        "simulate_devices(2) was called after TensorFlow initialised its runtime, which already has 4 logical "
        "CPU device(s)")
    assert "before any other TensorFlow call" in str(info.value)


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "2"])
def test_bad_counts_are_refused(n) -> None:
    with pytest.raises(ValueError, match=rf"n must be a positive integer. Received: n={n!r}"):
        tfl.strategies.simulate_devices(n)


def test_unknown_device_type_is_refused() -> None:
    with pytest.raises(ValueError, match=r"device_type must be 'CPU' or 'GPU'. Received: device_type='TPU'"):
        tfl.strategies.simulate_devices(2, device_type="TPU")
