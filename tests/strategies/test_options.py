"""Option validation of each strategy: one clear error per bad value."""


import portpicker
import pytest

import tensorfleet as tfl
from tensorfleet.compat import distribute as tf_internals
from tensorfleet.strategies.tpu import NoTPUError


def test_mirrored_rejects_unknown_cross_device_ops() -> None:
    with pytest.raises(ValueError) as info:
        tfl.strategies.build("mirrored", cross_device_ops="ring")
    assert str(info.value) == ("cross_device_ops must be one of 'nccl', 'hierarchical_copy', "
                               "'reduction_to_one_device'. Received: cross_device_ops='ring'")


def test_mirrored_nccl_needs_a_gpu() -> None:
    with pytest.raises(ValueError, match="cross_device_ops='nccl' needs GPUs and this machine has none"):
        tfl.strategies.build("mirrored", cross_device_ops="nccl")


@pytest.mark.parametrize("ops, cls", [("hierarchical_copy", "HierarchicalCopyAllReduce"),
                                      ("reduction_to_one_device", "ReductionToOneDevice")])
def test_mirrored_passes_cross_device_ops_through(ops: str, cls: str) -> None:
    strategy = tfl.strategies.build("mirrored", devices=["/cpu:0", "/cpu:1"], cross_device_ops=ops)
    assert type(tf_internals.cross_device_ops(strategy)).__name__ == cls
    assert strategy.num_replicas_in_sync == 2


def test_mirrored_defaults_to_every_logical_cpu(logical_cpus) -> None:
    assert tfl.strategies.build("mirrored").num_replicas_in_sync == len(logical_cpus) == 4


def test_unknown_device_is_refused_with_the_available_ones() -> None:
    with pytest.raises(ValueError) as info:
        tfl.strategies.build("mirrored", devices=["/cpu:0", "/cpu:9"])
    assert str(info.value).startswith("devices names '/cpu:9', which is not a device of this machine. Available: [")
    assert "simulate_devices(n)" in str(info.value)


@pytest.mark.parametrize("devices, message", [
    ("/cpu:0", "devices must be a non-empty list of device names. Received: devices='/cpu:0'"),
    ([], "devices must be a non-empty list of device names. Received: devices=[]"),
    (["/cpu:0", "/CPU:0"], "devices lists a device twice. Received: devices=['/cpu:0', '/CPU:0']"),
    (["cpu0"], "devices has an entry that is not a device name like '/cpu:0'. Received: 'cpu0'"),
    (["/cpu:0", 1], "devices has an entry that is not a device name like '/cpu:0'. Received: 1"),
])
def test_bad_device_lists_are_refused(devices, message) -> None:
    with pytest.raises(ValueError) as info:
        tfl.strategies.build("mirrored", devices=devices)
    assert str(info.value) == message


def test_num_packs_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"num_packs must be a positive integer. Received: num_packs=0"):
        tfl.strategies.build("mirrored", num_packs=0)


def test_central_storage_places_variables_on_the_parameter_device() -> None:
    strategy = tfl.strategies.build("central_storage", compute_devices=["/cpu:0", "/cpu:1"],
                                    parameter_device="/cpu:2")
    import tensorflow as tf

    with strategy.scope():
        v = tf.Variable(1.0)
    assert v.device.endswith("CPU:2")
    assert strategy.num_replicas_in_sync == 2


def test_multi_worker_rejects_unknown_implementation() -> None:
    with pytest.raises(ValueError) as info:
        tfl.strategies.build("mwms", implementation="tree")
    assert str(info.value) == "implementation must be one of 'auto', 'ring', 'nccl'. Received: implementation='tree'"


def test_multi_worker_nccl_needs_a_gpu() -> None:
    with pytest.raises(ValueError, match="implementation='nccl' needs GPUs"):
        tfl.strategies.build("mwms", implementation="nccl")


def test_multi_worker_rejects_bad_timeout() -> None:
    with pytest.raises(ValueError, match=r"timeout_seconds must be a finite number > 0. Received: timeout_seconds=-1"):
        tfl.strategies.build("mwms", timeout_seconds=-1)


def test_multi_worker_validates_the_tf_config_it_is_given() -> None:
    with pytest.raises(tfl.strategies.TFConfigError, match="has a port that is not a number"):
        tfl.strategies.build("mwms", tf_config={"cluster": {"worker": ["127.0.0.1:abc"]}})


def test_parameter_server_without_cluster_says_how_to_get_one(monkeypatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError) as info:
        tfl.strategies.build("parameter_server")
    assert str(info.value).startswith("parameter_server needs a cluster: set TF_CONFIG")
    assert "start_in_process_cluster()" in str(info.value)


def test_parameter_server_needs_ps_and_worker_tasks() -> None:
    spec = tfl.strategies.ClusterSpec.local(workers=2, ps=0)
    with pytest.raises(ValueError, match="parameter_server needs at least one 'ps' and one 'worker' task"):
        tfl.strategies.build("ps", cluster=spec)


def test_parameter_server_shard_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"max_shards must be a positive integer. Received: max_shards=0"):
        tfl.strategies.build("ps", max_shards=0)
    with pytest.raises(ValueError, match=r"min_shard_bytes only applies with max_shards"):
        tfl.strategies.build("ps", min_shard_bytes=1024)


def test_tpu_without_tpu_raises_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("TPU_NAME", raising=False)
    with pytest.raises(NoTPUError) as info:
        tfl.strategies.build("tpu")
    assert str(info.value).startswith("No TPU is attached to this machine and no tpu_address (or TPU_NAME) was given.")


@pytest.mark.parametrize("address", ["http://tpu:8470", "grpc://host", "grpc://:8470", "grpc://h:99999", "my tpu"])
def test_tpu_rejects_malformed_addresses(address: str) -> None:
    with pytest.raises(ValueError, match="tpu_address must"):
        tfl.strategies.build("tpu", tpu_address=address)


def test_tpu_address_that_nobody_serves_raises_clear_error() -> None:
    port = portpicker.pick_unused_port()
    with pytest.raises(NoTPUError, match=rf"^No TPU worker answers at grpc://127.0.0.1:{port} "):
        tfl.strategies.build("tpu", tpu_address=f"grpc://127.0.0.1:{port}", connect_timeout=2.0)


def test_tpu_name_off_cloud_raises_clear_error() -> None:
    with pytest.raises(NoTPUError, match="can only be resolved on a Cloud VM"):
        tfl.strategies.build("tpu", tpu_address="my-tpu")


def test_mirrored_strategies_of_different_sizes_coexist_in_one_process() -> None:
    import tensorflow as tf

    results = []
    for n in (2, 4, 2, 2):
        strategy = tfl.strategies.build("mirrored", devices=[f"/cpu:{i}" for i in range(n)])
        step = tf.function(lambda: strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.constant(1.0))))
        per_replica = step()
        results.append(float(strategy.experimental_local_results(per_replica)[0]))
    assert results == [2.0, 4.0, 2.0, 2.0]


def test_parameter_server_staleness_is_checked_before_anything_starts(monkeypatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="staleness"):
        tfl.strategies.build("ps", staleness=-1)


def test_blank_tf_config_means_no_cluster_instead_of_a_json_error(monkeypatch) -> None:
    monkeypatch.setenv("TF_CONFIG", " ")
    strategy = tfl.strategies.build("mirrored", devices=["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    import os

    assert "TF_CONFIG" not in os.environ
