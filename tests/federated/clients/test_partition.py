"""Partitioners: exact sizes, reproducibility, skew, errors; ArrayClientData and summaries."""

from __future__ import annotations

import numpy as np
import pytest

from tensorfleet.federated import partition, partition_indices
from tensorfleet.federated.clients.partition import parse_scheme
from tensorfleet.registry import UnknownNameError

LABELS = np.repeat(np.arange(10), 50)  # 500 samples, 50 per class


def test_iid_sizes_are_equal_and_cover_every_sample_once():
    parts = partition_indices(LABELS, 7, "iid", seed=3)
    assert sorted(len(p) for p in parts) == [71, 71, 71, 71, 72, 72, 72]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(500))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet:0.3", "shards:2", "quantity:0.5"])
def test_same_seed_same_partition_other_seed_other_partition(scheme):
    a = partition_indices(LABELS, 20, scheme, seed=1)
    b = partition_indices(LABELS, 20, scheme, seed=1)
    c = partition_indices(LABELS, 20, scheme, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert np.array_equal(np.sort(np.concatenate(a)), np.arange(500))
    assert min(len(p) for p in a) >= 1


def test_dirichlet_small_alpha_gives_fewer_labels_per_client_than_large_alpha():
    def mean_labels(alpha):
        parts = partition_indices(LABELS, 20, "dirichlet", seed=0, alpha=alpha)
        return np.mean([len(np.unique(LABELS[p])) for p in parts])

    assert mean_labels(0.1) < 4.0 < 9.0 < mean_labels(100.0)


def test_shards_give_each_client_k_contiguous_label_shards():
    parts = partition_indices(LABELS, 25, "shards:2", seed=0)  # 50 shards of 10: one label each
    assert [len(p) for p in parts] == [20] * 25
    assert max(len(np.unique(LABELS[p])) for p in parts) == 2


def test_quantity_sizes_are_unequal_and_sum_to_n():
    parts = partition_indices(LABELS, 10, "quantity", seed=0, beta=0.5)
    sizes = [len(p) for p in parts]
    assert sum(sizes) == 500 and min(sizes) >= 1
    assert max(sizes) > 3 * min(sizes)


def test_parse_scheme_reads_the_inline_parameter():
    assert parse_scheme("dirichlet:0.3").options == {"alpha": 0.3}
    assert parse_scheme("shards:2").options == {"shards_per_client": 2}
    assert parse_scheme("IID").name == "iid"


def test_more_clients_than_samples_is_refused():
    with pytest.raises(ValueError, match=r"num_clients must not exceed the number of samples \(500\).*num_clients=501"):
        partition_indices(LABELS, 501)


@pytest.mark.parametrize("alpha", [0, -1.0])
def test_non_positive_alpha_is_refused(alpha):
    with pytest.raises(ValueError, match=rf"alpha must be a finite number > 0. Received: alpha={alpha}"):
        partition_indices(LABELS, 10, "dirichlet", alpha=alpha)


def test_unknown_scheme_lists_the_schemes_with_a_suggestion():
    with pytest.raises(UnknownNameError, match=r"Unknown partition scheme 'dirichlt'. Did you mean 'dirichlet'\? "
                                               r"Available: iid, dirichlet, shards, quantity"):
        partition_indices(LABELS, 10, "dirichlt")


def test_bad_inline_value_and_unknown_option_are_refused():
    with pytest.raises(ValueError, match=r"must be an integer \(shards_per_client\). Received: scheme='shards:x'"):
        parse_scheme("shards:x")
    with pytest.raises(TypeError, match="Unknown option for partition scheme 'iid'"):
        partition_indices(LABELS, 10, "iid", alpha=0.1)


def test_partition_returns_client_data_with_the_clients_arrays(tmp_path):
    from tensorfleet.federated import ClientData

    x = np.arange(500, dtype=np.float32).reshape(500, 1) / 500
    clients = partition(x, LABELS.astype(np.int32), num_clients=5, scheme="shards:1", seed=0)
    assert isinstance(clients, ClientData)
    assert clients.client_ids == ["client_000", "client_001", "client_002", "client_003", "client_004"]
    cid = clients.client_ids[2]
    xs, ys = clients.arrays(cid)
    elements = list(clients.create_tf_dataset_for_client(cid).as_numpy_iterator())
    assert np.array_equal(np.stack([e["x"] for e in elements]), xs)
    # The traceable dataset function (what TFF's dataset_computation uses) gives the same rows.
    traced = list(clients.serializable_dataset_fn(cid).as_numpy_iterator())
    assert np.array_equal(np.array([e["y"] for e in traced]), ys)
    summary = clients.summary()
    assert summary.samples_per_client.tolist() == [100] * 5
    assert summary.labels_per_client.tolist() == [2] * 5
    assert "5 clients, 500 samples" in str(summary)
    png = summary.plot(tmp_path / "labels.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summary.save(tmp_path / "p.json").read_text().count('"samples": 100') == 5


def test_mismatched_x_and_y_are_refused():
    with pytest.raises(ValueError,
                       match=r"x and y must have the same number of samples. Received: len\(x\)=3, len\(y\)=500"):
        partition(np.zeros((3, 2)), LABELS, num_clients=2)


@pytest.mark.tff
def test_partition_s_client_data_is_served_to_tffs_dataset_computation():
    import tensorflow_federated as tff

    from tensorfleet.federated.clients.base import to_tff

    x = np.arange(500, dtype=np.float32).reshape(500, 1) / 500
    clients = partition(x, LABELS.astype(np.int32), num_clients=5, scheme="shards:1", seed=0)
    theirs = to_tff(clients)
    assert isinstance(theirs, tff.simulation.datasets.ClientData)
    # TFF traces the dataset function (the lookup table of row ranges) into its dataset computation.
    served = list(theirs.dataset_computation("client_003").as_numpy_iterator())
    assert np.array_equal(np.array([e["y"] for e in served]), clients.arrays("client_003")[1])


@pytest.mark.tff
def test_tffs_synthetic_emnist_is_summarized():
    import tensorflow_federated as tff

    from tensorfleet.federated import summarize

    summary = summarize(tff.simulation.datasets.emnist.get_synthetic())
    assert len(summary.client_ids) == 2
    assert summary.samples_per_client.tolist() == [10, 10]


def test_the_partition_plot_puts_ticks_on_whole_clients_only():
    import matplotlib.pyplot as plt

    from tensorfleet.federated.clients.clientdata import label_figure

    for num_clients in (3, 5, 20):
        fig = label_figure(partition(np.zeros((500, 2)), LABELS, num_clients=num_clients).summary())
        ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= num_clients - 1]
        plt.close(fig)
        assert ticks and all(float(t).is_integer() for t in ticks), (num_clients, ticks)
