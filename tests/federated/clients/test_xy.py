"""Client data named and batched as TFF users have it trains in a Simulation: tensorfleet's own ClientData
(every track), and TFF's own ClientData as it is (tff track)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet.compat.keras import keras2
from tensorfleet.federated import Simulation
from tensorfleet.federated.clients.base import ClientData
from tensorfleet.federated.clients.xy import is_batched, xy_clients, xy_keys

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


@pytest.fixture(scope="module")
def emnist():
    import tensorflow_federated as tff

    return tff.simulation.datasets.emnist.get_synthetic()  # 2 clients of 10 examples, 'label' and 'pixels'


@pytest.fixture(scope="module")
def ours():
    """tensorfleet's ClientData shaped as TFF's synthetic EMNIST: 2 clients of 10, 'pixels' and 'label'."""
    def dataset(cid):
        rng = np.random.default_rng(int(cid[-1]))
        return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
            label=np.arange(10, dtype=np.int32), pixels=rng.random((10, 28, 28)).astype(np.float32)))

    return ClientData.from_clients_and_tf_fn(["synthetic1", "synthetic2"], dataset)


def _tutorial(ds):
    # The preprocessing of TFF's "Federated Learning for Image Classification" tutorial.
    return ds.shuffle(10, seed=1).batch(20).map(lambda e: collections.OrderedDict(
        x=tf.reshape(e["pixels"], [-1, 784]), y=tf.reshape(e["label"], [-1, 1])))


def _spec(clients):
    return {k: (v.shape.as_list(), v.dtype.name) for k, v in clients.element_type_structure.items()}


@pytest.mark.tff
def test_tff_element_names_are_mapped_and_batches_unbatched(emnist):
    assert _spec(xy_clients(emnist)) == {"x": ([28, 28], "float32"), "y": ([], "int32")}
    batched = emnist.preprocess(_tutorial)
    assert is_batched(batched.element_type_structure) and not is_batched(emnist.element_type_structure)
    mapped = xy_clients(batched)
    assert _spec(mapped) == {"x": ([784], "float32"), "y": ([1], "int32")}
    assert mapped.description == "PreprocessClientData (unbatched)"
    examples = list(mapped.create_tf_dataset_for_client("synthetic1").as_numpy_iterator())
    assert len(examples) == 10 and sorted(int(e["y"][0]) for e in examples) == list(range(10))
    assert xy_keys({"image": 0, "label": 0, "coarse_label": 0}) == ("image", "label")  # CIFAR-100's names


def test_names_that_do_not_tell_are_asked_for_once_listing_the_names_found():
    spec = collections.OrderedDict(creation_date=0, score=0, title=0, tokens=0)  # StackOverflow's names
    with pytest.raises(ValueError, match=r"^Cannot tell the model input from the label in the client examples, whose "
                                         r"elements are 'creation_date', 'score', 'title', 'tokens'. Name them: "
                                         r"Simulation\(..., x_key=NAME, y_key=NAME\) \(Received: x_key=None, "
                                         r"y_key=None\).$"):
        xy_keys(spec)
    assert xy_keys(spec, x_key="tokens", y_key="score") == ("tokens", "score")
    with pytest.raises(ValueError, match=r"^y_key='label' is not an element of the client data; its elements are "
                                         r"'creation_date', 'score', 'title', 'tokens'. Received: y_key='label'$"):
        xy_keys(spec, x_key="tokens", y_key="label")


def _dense(input_dim):
    return lambda: tf_keras.Sequential([tf_keras.layers.Reshape((784,), input_shape=input_dim),
                                        tf_keras.layers.Dense(10)])


@pytest.mark.tff
def test_simulation_trains_on_tffs_synthetic_emnist_as_shipped_and_as_tutorials_batch_it(emnist):
    plain = Simulation(_dense((28, 28)), emnist, rounds=1, clients_per_round=2, batch_size=5, progress=False)
    assert [r["num_examples"] for r in plain.run().rounds] == [20]
    batched = emnist.preprocess(_tutorial)
    sim = Simulation(_dense((784,)), batched, rounds=1, clients_per_round=2, batch_size=5, straggler_deadline=100.0,
                     eval_clients=batched, progress=False)
    record = sim.run().rounds[0]
    assert record["num_examples"] == 20 and record["participants"] == 2 and 0 <= record["fed_eval_accuracy"] <= 1
    assert sim.sampler.num_examples("synthetic1") == 10  # examples, not batches


@pytest.mark.tff
def test_simulation_names_the_elements_when_it_cannot_tell(emnist):
    renamed = emnist.preprocess(lambda ds: ds.map(lambda e: {"a": e["pixels"], "b": e["label"]}))
    with pytest.raises(ValueError, match=r"elements are 'a', 'b'. Name them: Simulation\(..., x_key=NAME"):
        Simulation(_dense((28, 28)), renamed, rounds=1, clients_per_round=2)
    sim = Simulation(_dense((28, 28)), renamed, rounds=1, clients_per_round=2, x_key="a", y_key="b", progress=False)
    assert sim.clients.element_type_structure["y"].shape.as_list() == []
    assert np.isfinite(sim.run().rounds[0]["train_loss"])


def test_our_client_data_named_and_batched_as_tffs_trains_on_the_compiled_backend(ours):
    assert {k: (v.shape.as_list(), v.dtype.name) for k, v in xy_clients(ours).element_type_structure.items()} == \
        {"x": ([28, 28], "float32"), "y": ([], "int32")}
    batched = ours.preprocess(_tutorial)
    assert is_batched(batched.element_type_structure) and _spec(xy_clients(batched)) == \
        {"x": ([784], "float32"), "y": ([1], "int32")}
    plain = Simulation(_dense((28, 28)), ours, rounds=1, clients_per_round=2, batch_size=5, progress=False)
    assert [r["num_examples"] for r in plain.run().rounds] == [20] and plain.backend.value == "compiled"
    # Batched as TFF's tutorials batch (labels shaped [1]), federated evaluation on the same clients.
    sim = Simulation(_dense((784,)), batched, rounds=1, clients_per_round=2, batch_size=5, straggler_deadline=100.0,
                     eval_clients=batched, progress=False)
    record = sim.run().rounds[0]
    assert record["num_examples"] == 20 and record["participants"] == 2 and 0 <= record["fed_eval_accuracy"] <= 1
    model = _dense((784,))()
    sim.model_weights(sim.state).assign_weights_to(model)
    examples = [e for c in ours.client_ids for e in batched.create_tf_dataset_for_client(c).unbatch()]
    hits = [int(np.argmax(model(e["x"][None]).numpy()) == int(e["y"][0])) for e in examples]
    assert record["fed_eval_accuracy"] == pytest.approx(np.mean(hits), abs=1e-9)
    renamed = ours.preprocess(lambda ds: ds.map(lambda e: {"a": e["pixels"], "b": e["label"]}))
    with pytest.raises(ValueError, match=r"elements are 'a', 'b'. Name them: Simulation\(..., x_key=NAME"):
        Simulation(_dense((28, 28)), renamed, rounds=1, clients_per_round=2)
    sim = Simulation(_dense((28, 28)), renamed, rounds=1, clients_per_round=2, x_key="a", y_key="b", progress=False,
                     eval_clients=renamed)
    record = sim.run().rounds[0]
    assert record["num_examples"] == 20 and 0 <= record["fed_eval_accuracy"] <= 1
    assert sim.sampler.num_examples("synthetic1") == 10


@pytest.mark.tff
def test_tffs_client_data_comes_back_as_tffs_own_and_ours_becomes_a_tff_client_data(emnist, ours):
    import tensorflow_federated as tff

    from tensorfleet.federated.clients.base import as_client_data, to_tff

    assert to_tff(as_client_data(emnist)) is emnist
    theirs = to_tff(ours)
    assert isinstance(theirs, tff.simulation.datasets.ClientData) and theirs.client_ids == ["synthetic1", "synthetic2"]
    rows = list(theirs.create_tf_dataset_for_client("synthetic2").as_numpy_iterator())
    mine = list(ours.create_tf_dataset_for_client("synthetic2").as_numpy_iterator())
    assert len(rows) == 10 and all(np.array_equal(a["pixels"], b["pixels"]) for a, b in zip(rows, mine))
