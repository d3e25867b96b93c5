"""The planner: famous models against the 16-bytes rule, layouts, the recommendation, errors."""

from __future__ import annotations

import pytest

from tensorfleet import validation
from tensorfleet.planner import cost_model, plans as planner

_GROUPS = {"shape": (planner.ModelShape,
                     {"seq_len": "seq_len", "layers": "layers", "hidden": "hidden", "heads": "heads"}),
           "network": (planner.Network, {"nodes": "nodes", "intra_bandwidth": "intra_bandwidth", "latency": "latency"}),
           "training": (planner.TrainingOptions, {"optimizer": "optimizer", "precision": "precision",
                                                  "recompute": "recompute", "zero": "zero"}),
           "servers": (planner.ParameterServers, {"ps_servers": "count", "server_memory": "memory"})}


def _plan(*args, **flat):
    """``planner.plan`` with the option groups made from the flat names the CLI's options have."""
    grouped = {}
    for group, (kind, names) in _GROUPS.items():
        given = {field: flat.pop(name) for name, field in names.items() if name in flat}
        if given:
            grouped[group] = kind(**given)
    return planner.plan(*args, **flat, **grouped)


@pytest.mark.parametrize("parameters", [1.5e9, 175e9])
def test_famous_transformers_match_16_bytes_per_parameter_for_mixed_precision_adam(parameters):
    result = _plan(parameters=parameters, batch_size=1024, devices=1024, nodes=128,
                          device_memory="80GB", bandwidth="200Gbps", intra_bandwidth="300GB/s",
                          seq_len=2048) if parameters > 1e10 else _plan(
        parameters=parameters, batch_size=32, devices=8, device_memory="80GB", bandwidth="100Gbps")
    data = result.row("data_allreduce")
    # Exact up to float summation of the per-layer counts.
    assert data.memory.model_states == pytest.approx(16 * parameters, rel=1e-12)
    assert (data.memory.parameters, data.memory.gradients, data.memory.optimizer_state) == pytest.approx(
        (2 * parameters, 2 * parameters, 12 * parameters), rel=1e-12)


def test_175b_fits_only_when_split_over_many_devices():
    result = _plan(parameters=175e9, layers=96, hidden=12288, heads=96, seq_len=2048, batch_size=1024,
                          devices=1024, nodes=128, device_memory="80GB", bandwidth="200Gbps",
                          intra_bandwidth="300GB/s")
    assert not result.row("data_allreduce").fits  # 2.8 TB of model states per device
    assert result.recommendation in ("hybrid", "pipeline", "tensor")
    best = result.row(result.recommendation)
    assert best.fits and best.memory.total <= 80e9
    layout = best.layout
    assert layout["data"] * layout["tensor"] * layout["pipeline"] == 1024


def test_data_parallel_communication_is_the_ring_all_reduce_of_the_gradients():
    result = _plan(parameters=1e9, batch_size=64, devices=8, device_memory="80GB", bandwidth="100Gbps",
                          latency="5us", layers=24, hidden=1864, heads=8)
    link = cost_model.Link(alpha=5e-6, beta=1 / 12.5e9)
    assert result.row("data_allreduce").comm_seconds == pytest.approx(cost_model.predict("ring", 8, 2e9, link))
    assert result.row("data_ps").comm_seconds == pytest.approx(cost_model.predict("ps", 8, 2e9, link))
    # The parameter server keeps the optimizer state: workers hold only weights and gradients.
    assert result.row("data_ps").memory.optimizer_state == 0
    assert result.row("data_allreduce").compute_seconds == pytest.approx(6 * 1e9 * 64 * 1024 / (8 * 100e12))


def test_zero_stages_shard_the_data_parallel_rows_and_stage_3_sends_half_as_much_again():
    args = {"parameters": 1e9, "batch_size": 64, "devices": 8, "device_memory": "80GB", "bandwidth": "100Gbps",
            "latency": "5us", "layers": 24, "hidden": 1864, "heads": 8}
    link = cost_model.Link(alpha=5e-6, beta=1 / 12.5e9)
    rows = {z: _plan(**args, zero=z) for z in range(4)}
    states = [(r.row("data_allreduce").memory.parameters, r.row("data_allreduce").memory.gradients,
               r.row("data_allreduce").memory.optimizer_state) for r in rows.values()]
    expected = [(2e9, 2e9, 12e9), (2e9, 2e9, 1.5e9), (2e9, 0.25e9, 1.5e9), (0.25e9, 0.25e9, 1.5e9)]
    assert [pytest.approx(s, rel=1e-12) for s in states] == expected  # layer counts summed in floats
    assert [r.row("data_allreduce").comm_seconds for r in rows.values()] == pytest.approx(
        [cost_model.predict("ring", 8, 2e9, link)] * 3 + [cost_model.predict("ring", 8, 3e9, link)])
    assert rows[2].row("data_allreduce").note == "ring all-reduce; ZeRO stage 2"
    assert rows[2].inputs["zero"] == 2 and rows[0].inputs["zero"] == 0
    # data_ps keeps its state on the servers; tensor and pipeline have one replica: nothing to shard.
    for strategy in ("data_ps", "tensor", "pipeline"):
        assert rows[3].row(strategy).memory == rows[0].row(strategy).memory
    # The best hybrid (d=2 here) shards over its 2 replicas.
    hybrid = rows[3].row("hybrid")
    assert hybrid.memory.model_states == pytest.approx(1e9 * 16 / 8)


def test_two_machines_use_the_hierarchical_all_reduce():
    result = _plan(parameters=1e9, batch_size=64, devices=16, nodes=2, device_memory="80GB",
                          bandwidth="25Gbps", intra_bandwidth="300GB/s", latency="0us")
    expected = cost_model.predict_hierarchical(2, 8, 2e9, intra=cost_model.Link(0, 1 / 300e9),
                                               inter=cost_model.Link(0, 1 / 3.125e9))
    assert result.row("data_allreduce").comm_seconds == pytest.approx(expected)


def test_pipeline_suggests_micro_batches_and_reports_the_bubble():
    result = _plan(parameters=1.5e9, batch_size=32, devices=8, device_memory="80GB", bandwidth="100Gbps")
    row = result.row("pipeline")
    assert row.layout == {"data": 1, "tensor": 1, "pipeline": 8}
    assert "32 micro-batches, bubble 18%" in row.note  # (8-1)/(32+8-1) = 17.9%
    assert row.compute_seconds == pytest.approx(result.row("data_allreduce").compute_seconds * 39 / 32)


def test_a_keras_model_by_name_uses_its_real_counts():
    result = _plan("digits_cnn", batch_size=256, devices=4, device_memory="16GB", bandwidth="10Gbps",
                          precision="float32", optimizer="adam")
    assert result.workload.parameters == 38282
    assert result.row("data_allreduce").memory.model_states == 38282 * 16
    assert result.recommendation == "data_allreduce"
    assert result.reason.startswith("fits (")
    text = result.table()
    assert "recommendation: data_allreduce" in text and "digits_cnn" in text
    assert [s["strategy"] for s in result.as_dict()["strategies"]] == [
        "data_allreduce", "data_ps", "tensor", "pipeline", "hybrid"]


XL = {"transformer": "gpt2-xl", "batch_size": 1, "devices": 1, "device_memory": "32GB", "bandwidth": "100Gbps",
      "recompute": False}
XL_PARAMETERS = 1_557_611_200


def test_gpt2_xl_that_does_not_fit_32gb_is_reported_as_not_fitting():
    # With 12 heads (hidden // 128) this was 30.62 GB and "fits"; GPT-2 XL has 25.
    result = _plan(**XL)
    row = result.row("data_allreduce")
    assert row.memory.model_states == 16 * XL_PARAMETERS
    assert row.memory.activations == 48 * 186_777_600 + 5 * 1024 * 1600 + 4 * 1024 * 50257 == 9_179_369_472
    assert row.memory.total == 34_101_148_672 and not row.fits
    assert result.as_dict()["model"] == "gpt2_xl" and result.workload.shape.heads == 25
    # Allowed to recompute, it fits: only each layer's input (s x h) is kept, plus one layer rebuilt.
    saved = _plan(**{**XL, "recompute": None}).row("data_allreduce")
    assert saved.fits and "full recomputation" in saved.note
    # Every layer's 16-bit input, what lies outside the blocks, and one block rebuilt beyond its input.
    assert saved.memory.activations == (48 * 1024 * 1600 * 2 + 5 * 1024 * 1600 + 4 * 1024 * 50257
                                        + 186_777_600 - 1024 * 1600 * 2) == 554_831_872


def test_sequence_length_and_heads_are_inputs():
    short = _plan(**{**XL, "seq_len": 256}).row("data_allreduce")
    assert short.memory.activations == 48 * 256 * (34 * 1600 + 5 * 25 * 256) + 5 * 256 * 1600 + 4 * 256 * 50257
    by_count = _plan(**{**XL, "transformer": None, "parameters": XL_PARAMETERS, "layers": 48, "hidden": 1600,
                               "heads": 25}).row("data_allreduce")
    assert by_count.memory.activations == 48 * 186_777_600 + 5 * 1024 * 1600  # no vocabulary given
    with pytest.raises(ValueError, match=r"^transformer='gpt2-xl' fixes layers, hidden and heads; for another shape "
                                         r"give parameters= with them. Received: heads=16$"):
        _plan(**{**XL, "heads": 16})
    with pytest.raises(ValueError, match=r"^seq_len describes a transformer \(parameters= or transformer=\); a Keras "
                                         r"model has its own shape. Received: model='digits_cnn', seq_len=128$"):
        _plan(**{**XL, "transformer": None, "model": "digits_cnn", "seq_len": 128})
    with pytest.raises(ValueError, match=r"^seq_len, heads describe a transformer"):
        _plan(**{**XL, "transformer": None, "model": "digits_cnn", "seq_len": 128, "heads": 2})
    with pytest.raises(ValueError, match=r"^gpt2_xl takes sequences of at most 1024 tokens \(its position table\). "
                                         r"Received: seq_len=2048$"):
        _plan(**{**XL, "seq_len": 2048})


def test_parameter_servers_must_hold_the_weights_and_optimizer_state():
    result = _plan(**XL)
    ps = result.row("data_ps")
    # Workers: fp16 weights and gradients and the activations; servers: fp32 weights + 2 Adam states.
    assert ps.memory.total == 4 * XL_PARAMETERS + 9_179_369_472 and ps.server_memory == 12 * XL_PARAMETERS
    assert ps.fits and result.recommendation == "data_ps"
    assert ps.note == ("1 parameter server, 18.69 GB of 32.00 GB each (server memory not given: a device's); "
                       "1 worker: the traffic buys only the memory the servers hold")
    small = _plan(**{**XL, "server_memory": "16GB", "ps_servers": 2}).row("data_ps")
    assert small.fits and small.server_memory == 6 * XL_PARAMETERS
    assert small.note.startswith("2 parameter servers, 9.35 GB of 16.00 GB each; ")
    with pytest.raises(ValueError) as info:
        _plan(**{**XL, "server_memory": "16GB"})
    assert str(info.value).endswith("more parameter servers or more memory on them (18.69 GB each needed with 1).")


def test_one_worker_still_pushes_gradients_to_the_server_and_pulls_weights_back():
    ps = _plan(**XL).row("data_ps")
    gradient_bytes = 2 * XL_PARAMETERS
    assert ps.comm_seconds == pytest.approx(2 * (5e-6 + gradient_bytes / 12.5e9), rel=1e-12)  # was 0
    assert _plan(**XL).row("data_allreduce").comm_seconds == 0.0
    link = cost_model.Link(alpha=5e-6, beta=1 / 12.5e9)
    # Several servers share the load of many workers; a worker still sends all its gradients.
    assert cost_model.predict_parameter_server(8, 2, 1e6, link) == pytest.approx(2 * (5e-6 + 4e6 / 12.5e9))
    assert cost_model.predict_parameter_server(2, 8, 1e6, link) == pytest.approx(2 * (5e-6 + 1e6 / 12.5e9))


@pytest.mark.parametrize(
    "kwargs,tips",
    [
        ({}, "What could help: at least 175 devices of this memory (the model states alone are 2.80 TB); ZeRO "
             "stage 3 (zero=3), which shards the model states over data-parallel replicas (350.00 GB per device on "
             "8); an "
             "optimizer with less state than adam: momentum (12 bytes per parameter) or sgd (8 bytes per parameter); "
             "a smaller batch."),
        ({"precision": "float32", "optimizer": "sgd"},
         "What could help: at least 88 devices of this memory (the model states alone are 1.40 TB); ZeRO stage 3 "
         "(zero=3), which shards the model states over data-parallel replicas (175.00 GB per device on 8); mixed "
         "precision, "
         "which halves the activations (not the model states: sgd keeps 8 bytes per parameter either way); a smaller "
         "batch."),
        ({"optimizer": "momentum", "batch_size": 1, "devices": 1},
         "What could help: at least 132 devices of this memory (the model states alone are 2.10 TB); an optimizer "
         "with less state than momentum: sgd (8 bytes per parameter)."),
        ({"optimizer": "sgd", "batch_size": 1, "devices": 1},
         "What could help: at least 88 devices of this memory (the model states alone are 1.40 TB)."),
    ],
)
def test_fits_nowhere_suggests_only_what_is_not_already_in_use(kwargs, tips):
    args = {"parameters": 175e9, "batch_size": 8, "devices": 8, "device_memory": "16GB", "bandwidth": "100Gbps"}
    with pytest.raises(ValueError) as info:
        _plan(**{**args, **kwargs})
    assert str(info.value).split(" missing. ")[1] == tips


def test_fits_nowhere_says_how_much_memory_is_missing():
    with pytest.raises(ValueError) as info:
        _plan(parameters=175e9, batch_size=8, devices=8, device_memory="16GB", bandwidth="100Gbps")
    message = str(info.value)
    assert "fits nowhere on 8 device(s) of 16.00 GB" in message
    smallest = float(message.split("smallest need is ")[1].split(" GB")[0])
    missing = float(message.split("per device (")[1].split(", ")[1].split(" GB missing")[0])
    assert missing == pytest.approx(smallest - 16.0, abs=0.011)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"batch_size": -1}, "batch_size must be a positive integer. Received: batch_size=-1"),
        ({"devices": 0}, "devices must be a positive integer. Received: devices=0"),
        ({"device_memory": "16XB"}, "Unknown memory unit 'XB' in '16XB'"),
        ({"bandwidth": "100Gbs"}, "Unknown bandwidth unit 'Gbs'"),
        ({"devices": 6, "nodes": 4}, "devices must be a multiple of nodes. Received: devices=6, nodes=4"),
        ({"optimizer": "lion"}, "optimizer must be one of 'sgd', 'momentum', 'adam'. Received: optimizer='lion'"),
        ({"device_tflops": 0}, "device_tflops must be a finite number > 0. Received: device_tflops=0"),
        ({"parameters": -1}, "parameters must be a finite number > 0. Received: parameters=-1"),
        ({"seq_len": True}, "seq_len must be a positive integer. Received: seq_len=True"),
        ({"bandwidth": "100"}, "A bandwidth needs a unit, such as '100Gbps'. Received: '100'"),
        ({"intra_bandwidth": "300"}, "A bandwidth needs a unit, such as '100Gbps'. Received: '300'"),
        ({"device_memory": "80"}, "A memory size needs a unit, such as '16GB'. Received: '80'"),
        ({"latency": "5"}, "A latency needs a unit, such as '5us'. Received: '5'"),
        ({"server_memory": "0GB"}, "servers.memory must be positive. Received: servers.memory='0GB'"),
        ({"ps_servers": 0}, "servers.count must be a positive integer. Received: servers.count=0"),
        ({"network": {"nodes": 2}}, "network must be a tensorfleet.planner.plans.Network. Received: "
                                    "network={'nodes': 2}"),
        ({"zero": 4}, "zero must be an integer from 0 to 3. Received: zero=4"),
        ({"parameters": None, "transformer": "gpt5"}, "Unknown transformer 'gpt5'"),
    ],
)
def test_bad_input_gets_one_clear_error(kwargs, message):
    args = {"parameters": 1e9, "batch_size": 8, "devices": 8, "device_memory": "80GB", "bandwidth": "100Gbps"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        _plan(**args)


def test_parse_count_and_model_or_params_exclusive():
    assert validation.parse_count("1.5B") == 1.5e9 and validation.parse_count("175e9") == 175e9
    with pytest.raises(ValueError, match="Unknown parameter-count suffix in '3Q'"):
        validation.parse_count("3Q")
    with pytest.raises(ValueError, match="must be positive. Received: '-2B'"):
        validation.parse_count("-2B")
    with pytest.raises(ValueError, match="exactly one of model"):
        _plan(transformer="gpt2", parameters=1e6, batch_size=8, devices=1, device_memory="1GB",
                     bandwidth="1Gbps")
    with pytest.raises(ValueError, match="exactly one of model"):
        _plan("digits_cnn", parameters=1e6, batch_size=8, devices=1, device_memory="1GB", bandwidth="1Gbps")
