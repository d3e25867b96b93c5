"""Lazy client data: only the clients a round samples are made."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorfleet.compat.keras import keras2

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


def _linear_digits() -> Any:

    return tf_keras.Sequential([tf_keras.layers.Flatten(input_shape=(8, 8, 1)),
                                tf_keras.layers.Dense(10, kernel_initializer="zeros")])


def test_a_client_is_made_only_when_asked_and_always_the_same() -> None:
    from tensorfleet.federated.clients.lazy import LazyClientData

    calls: list[int] = []

    def make(i: int) -> tuple[np.ndarray, np.ndarray]:
        calls.append(i)
        rng = np.random.default_rng(i)
        return rng.random((3, 2)).astype(np.float32), np.full(3, i % 10, np.int32)

    clients = LazyClientData(make, 3400)
    assert calls == [0]  # one client fixes the element spec
    assert clients.num_clients == 3400
    assert clients.client_ids[-1] == "client_3399"
    assert clients.element_type_structure["x"].shape == (2,)
    x1, y1 = clients.arrays("client_1234")
    x2, _ = clients.arrays("client_1234")
    np.testing.assert_array_equal(x1, x2)
    assert y1.tolist() == [4, 4, 4]
    assert calls == [0, 1234, 1234]
    assert clients.materialized == ["client_0000", "client_1234", "client_1234"]
    ds = clients.create_tf_dataset_for_client("client_0002")
    assert [int(e["y"]) for e in ds] == [2, 2, 2]
    served = clients.serializable_dataset_fn("client_0003")
    assert [int(e["y"]) for e in served] == [3, 3, 3]


@pytest.mark.parametrize(("args", "error", "message"), [
    ((None, 10), TypeError, "make_client must be a callable taking a client index. Received: None"),
    ((lambda i: (np.zeros((1, 1)), np.zeros(1)), 0), ValueError,
     "num_clients must be a positive integer. Received: num_clients=0"),
    ((lambda i: (np.zeros((2, 1)), np.zeros(1)), 5), ValueError,
     "make_client(0) must return non-empty x and y of the same length. Received: len(x)=2, len(y)=1"),
])
def test_bad_lazy_client_data_is_refused(args: tuple[Any, ...], error: type, message: str) -> None:
    from tensorfleet.federated.clients.lazy import LazyClientData

    with pytest.raises(error) as info:
        LazyClientData(*args)
    assert str(info.value) == message


def test_emnist_like_clients_have_emnist_shapes_and_are_seeded() -> None:
    from tensorfleet.federated.clients.lazy import emnist_like_clients

    clients = emnist_like_clients(3400, examples_per_client=12, seed=5)
    x, y = clients.arrays("client_3399")
    assert x.shape == (12, 28, 28, 1) and x.dtype == np.float32
    assert y.dtype == np.int32 and set(y.tolist()) <= set(range(10))
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    again, _ = emnist_like_clients(3400, examples_per_client=12, seed=5).arrays("client_3399")
    np.testing.assert_array_equal(x, again)
    other, _ = clients.arrays("client_0001")
    assert not np.array_equal(x, other)
    with pytest.raises(ValueError, match="label_alpha must be a finite number > 0. Received: label_alpha=0"):
        emnist_like_clients(10, label_alpha=0)


@pytest.mark.timeout(240)
def test_simulation_on_3400_lazy_clients_makes_only_the_sampled_ones() -> None:
    from tensorfleet.federated import Simulation
    from tensorfleet.federated.clients.lazy import digits_clients

    clients = digits_clients(3400, examples_per_client=15, seed=2)
    assert clients.materialized == ["client_0000"]
    sim = Simulation(_linear_digits, clients, "fedavg", rounds=2, clients_per_round=5, seed=4, progress=False)
    history = sim.run()
    sampled = [cid for r in (1, 2) for cid in sim.sample(r)["participants"]]
    assert len(sampled) == 10
    assert clients.materialized[1:] == sampled  # each round made its 5 clients, and nothing else
    assert [r["num_examples"] for r in history.rounds] == [75, 75]
    with pytest.raises(ValueError, match="examples_per_client must not exceed the 1438 samples"):
        digits_clients(3, examples_per_client=5000)


def test_lazy_client_data_is_exported_from_the_package() -> None:
    import tensorfleet as tfl
    from tensorfleet.federated.clients import lazy

    assert tfl.federated.LazyClientData is lazy.LazyClientData
    assert tfl.federated.emnist_like_clients is lazy.emnist_like_clients
