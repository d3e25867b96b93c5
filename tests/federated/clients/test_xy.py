"""TFF's own ClientData, as TFF users have it (their element names, batched or not), trains in a Simulation."""

from __future__ import annotations

import collections

import numpy as np
import pytest

tff = pytest.importorskip("tensorflow_federated")

import tensorflow as tf  # noqa: E402

from tensorfleet.federated import Simulation  # noqa: E402
from tensorfleet.federated.clients.xy import is_batched, xy_clients, xy_keys  # noqa: E402


@pytest.fixture(scope="module")
def emnist():
    return tff.simulation.datasets.emnist.get_synthetic()  # 2 clients of 10 examples, 'label' and 'pixels'


def _tutorial(ds):
    # The preprocessing of TFF's "Federated Learning for Image Classification" tutorial.
    return ds.shuffle(10, seed=1).batch(20).map(lambda e: collections.OrderedDict(
        x=tf.reshape(e["pixels"], [-1, 784]), y=tf.reshape(e["label"], [-1, 1])))


def _spec(clients):
    return {k: (v.shape.as_list(), v.dtype.name) for k, v in clients.element_type_structure.items()}


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
    return lambda: tf.keras.Sequential([tf.keras.layers.Reshape((784,), input_shape=input_dim),
                                        tf.keras.layers.Dense(10)])


def test_simulation_trains_on_tffs_synthetic_emnist_as_shipped_and_as_tutorials_batch_it(emnist):
    plain = Simulation(_dense((28, 28)), emnist, rounds=1, clients_per_round=2, batch_size=5, progress=False)
    assert [r["num_examples"] for r in plain.run().rounds] == [20]
    batched = emnist.preprocess(_tutorial)
    sim = Simulation(_dense((784,)), batched, rounds=1, clients_per_round=2, batch_size=5, straggler_deadline=100.0,
                     eval_clients=batched, progress=False)
    record = sim.run().rounds[0]
    assert record["num_examples"] == 20 and record["participants"] == 2 and 0 <= record["fed_eval_accuracy"] <= 1
    assert sim.sampler.num_examples("synthetic1") == 10  # examples, not batches


def test_simulation_names_the_elements_when_it_cannot_tell(emnist):
    renamed = emnist.preprocess(lambda ds: ds.map(lambda e: {"a": e["pixels"], "b": e["label"]}))
    with pytest.raises(ValueError, match=r"elements are 'a', 'b'. Name them: Simulation\(..., x_key=NAME"):
        Simulation(_dense((28, 28)), renamed, rounds=1, clients_per_round=2)
    sim = Simulation(_dense((28, 28)), renamed, rounds=1, clients_per_round=2, x_key="a", y_key="b", progress=False)
    assert sim.clients.element_type_structure["y"].shape.as_list() == []
    assert np.isfinite(sim.run().rounds[0]["train_loss"])
