import pytest

import tensorfleet as tfl
from tensorfleet.registry import UnknownNameError

EXPECTED = ["auto", "one_device", "mirrored", "multi_worker_mirrored", "parameter_server", "central_storage", "tpu"]


def test_available_lists_every_strategy_in_order() -> None:
    assert tfl.strategies.available() == EXPECTED


@pytest.mark.parametrize("alias, name", [("mwms", "multi_worker_mirrored"), ("ps", "parameter_server"),
                                         ("Multi-Worker-Mirrored", "multi_worker_mirrored")])
def test_aliases_resolve(alias: str, name: str) -> None:
    assert tfl.strategies.STRATEGIES.canonical(alias) == name


def test_unknown_strategy_lists_available_names_and_suggests_closest() -> None:
    with pytest.raises(UnknownNameError) as info:
        tfl.strategies.build("mirorred")
    assert str(info.value) == (
        "Unknown strategy 'mirorred'. Did you mean 'mirrored'? Available: auto, one_device, mirrored, "
        "multi_worker_mirrored, parameter_server, central_storage, tpu."
    )


def test_unknown_option_names_the_options_the_strategy_takes() -> None:
    with pytest.raises(TypeError) as info:
        tfl.strategies.build("mirrored", device="/cpu:0")
    assert str(info.value) == (
        "Strategy 'mirrored' does not take option(s) device. Its options are: devices, cross_device_ops, num_packs, "
        "compression. device is an option of: one_device."
    )


def test_multi_worker_mirrored_refuses_a_cluster_with_ps_tasks(monkeypatch) -> None:
    # Its workers would wait on collectives the ps tasks never join: `launch --ps 1` of such a script hung silently.
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    message = ("multi_worker_mirrored runs on a cluster of workers (and a chief); this TF_CONFIG has 1 ps task(s). "
               "Build 'parameter_server' for a cluster with ps tasks, or start the job without them (tensorfleet "
               "launch without --ps). Received: cluster={'worker': 2, 'ps': 1}")
    with pytest.raises(ValueError) as given:
        tfl.strategies.build("multi_worker_mirrored", tf_config={"cluster": cluster,
                                                                 "task": {"type": "worker", "index": 0}})
    assert str(given.value) == message
    monkeypatch.setenv("TF_CONFIG", '{"cluster": %s, "task": {"type": "ps", "index": 0}}'
                       % str(cluster).replace("'", '"'))
    with pytest.raises(ValueError) as from_env:
        tfl.strategies.build("mwms")
    assert str(from_env.value) == message


def test_describe_shows_aliases_and_options() -> None:
    text = tfl.strategies.describe("ps")
    assert text.startswith("parameter_server (aliases: ps): ParameterServerStrategy")
    assert "options: cluster=None, max_shards=None, min_shard_bytes=None, staleness=None, serve=True" in text


def test_register_a_custom_strategy_and_build_it() -> None:
    import tensorflow as tf

    tfl.strategies.register("test_first_cpu", lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
                            description="for a test")
    try:
        strategy = tfl.strategies.build("test_first_cpu")
        assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    finally:
        tfl.strategies.STRATEGIES.unregister("test_first_cpu")


def test_tpu_is_not_available_here() -> None:
    entry, availability = tfl.strategies.info("tpu")
    assert (entry.name, availability.ok, availability.reason) == ("tpu", False, "no TPU attached and no TPU_NAME")


@pytest.mark.slow
def test_importing_the_package_does_not_import_tensorflow_and_names_load_lazily() -> None:
    import subprocess
    import sys

    code = ("import sys, tensorfleet as tfl; s = (tfl.strategies, tfl.model_parallel, tfl.cluster, tfl.planner); "
            "before = 'tensorflow' in sys.modules; "
            "from tensorfleet.model_parallel import pipeline; "
            "print(before, tfl.model_parallel.Pipeline is pipeline.Pipeline, tfl.cluster.launch.__module__, "
            "tfl.planner.plan.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "True", "tensorfleet.cluster.launcher", "tensorfleet.planner.plans"], \
        out.stderr[-2000:]
    with pytest.raises(AttributeError, match="module 'tensorfleet.strategies' has no attribute 'nope'"):
        tfl.strategies.nope
