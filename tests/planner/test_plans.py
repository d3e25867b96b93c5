"""The planner: famous models against the 16-bytes rule, layouts, the recommendation, errors."""

from __future__ import annotations

import pytest

from tensorfleet import validation
from tensorfleet.planner import cost_model
from tensorfleet.planner import plans as planner


@pytest.mark.parametrize("parameters", [1.5e9, 175e9])
def test_famous_transformers_match_16_bytes_per_parameter_for_mixed_precision_adam(parameters):
    result = planner.plan(parameters=parameters, batch_size=1024, devices=1024, nodes=128,
                          device_memory="80GB", bandwidth="200Gbps", intra_bandwidth="300GB/s",
                          seq_len=2048) if parameters > 1e10 else planner.plan(
        parameters=parameters, batch_size=32, devices=8, device_memory="80GB", bandwidth="100Gbps")
    data = result.row("data_allreduce")
    # Exact up to float summation of the per-layer counts.
    assert data.memory.model_states == pytest.approx(16 * parameters, rel=1e-12)
    assert (data.memory.parameters, data.memory.gradients, data.memory.optimizer_state) == pytest.approx(
        (2 * parameters, 2 * parameters, 12 * parameters), rel=1e-12)


def test_175b_fits_only_when_split_over_many_devices():
    result = planner.plan(parameters=175e9, layers=96, hidden=12288, seq_len=2048, batch_size=1024,
                          devices=1024, nodes=128, device_memory="80GB", bandwidth="200Gbps",
                          intra_bandwidth="300GB/s")
    assert not result.row("data_allreduce").fits  # 2.8 TB of model states per device
    assert result.recommendation in ("hybrid", "pipeline", "tensor")
    best = result.row(result.recommendation)
    assert best.fits and best.memory.total <= 80e9
    layout = best.layout
    assert layout["data"] * layout["tensor"] * layout["pipeline"] == 1024


def test_data_parallel_communication_is_the_ring_all_reduce_of_the_gradients():
    result = planner.plan(parameters=1e9, batch_size=64, devices=8, device_memory="80GB", bandwidth="100Gbps",
                          latency="5us", layers=24, hidden=1864)
    link = cost_model.Link(alpha=5e-6, beta=1 / 12.5e9)
    assert result.row("data_allreduce").comm_seconds == pytest.approx(cost_model.predict("ring", 8, 2e9, link))
    assert result.row("data_ps").comm_seconds == pytest.approx(cost_model.predict("ps", 8, 2e9, link))
    # The parameter server keeps the optimizer state: workers hold only weights and gradients.
    assert result.row("data_ps").memory.optimizer_state == 0
    assert result.row("data_allreduce").compute_seconds == pytest.approx(6 * 1e9 * 64 * 1024 / (8 * 100e12))


def test_two_machines_use_the_hierarchical_all_reduce():
    result = planner.plan(parameters=1e9, batch_size=64, devices=16, nodes=2, device_memory="80GB",
                          bandwidth="25Gbps", intra_bandwidth="300GB/s", latency="0us")
    expected = cost_model.predict_hierarchical(2, 8, 2e9, intra=cost_model.Link(0, 1 / 300e9),
                                               inter=cost_model.Link(0, 1 / 3.125e9))
    assert result.row("data_allreduce").comm_seconds == pytest.approx(expected)


def test_pipeline_suggests_micro_batches_and_reports_the_bubble():
    result = planner.plan(parameters=1.5e9, batch_size=32, devices=8, device_memory="80GB", bandwidth="100Gbps")
    row = result.row("pipeline")
    assert row.layout == {"data": 1, "tensor": 1, "pipeline": 8}
    assert "32 micro-batches, bubble 18%" in row.note  # (8-1)/(32+8-1) = 17.9%
    assert row.compute_seconds == pytest.approx(result.row("data_allreduce").compute_seconds * 39 / 32)


def test_a_keras_model_by_name_uses_its_real_counts():
    result = planner.plan("digits_cnn", batch_size=256, devices=4, device_memory="16GB", bandwidth="10Gbps",
                          precision="float32", optimizer="adam")
    assert result.workload.parameters == 38282
    assert result.row("data_allreduce").memory.model_states == 38282 * 16
    assert result.recommendation == "data_allreduce"
    assert result.reason.startswith("fits (")
    text = result.table()
    assert "recommendation: data_allreduce" in text and "digits_cnn" in text
    assert [s["strategy"] for s in result.as_dict()["strategies"]] == [
        "data_allreduce", "data_ps", "tensor", "pipeline", "hybrid"]


def test_fits_nowhere_says_how_much_memory_is_missing():
    with pytest.raises(ValueError) as info:
        planner.plan(parameters=175e9, batch_size=8, devices=8, device_memory="16GB", bandwidth="100Gbps")
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
    ],
)
def test_bad_input_gets_one_clear_error(kwargs, message):
    args = {"parameters": 1e9, "batch_size": 8, "devices": 8, "device_memory": "80GB", "bandwidth": "100Gbps"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        planner.plan(**args)


def test_parse_count_and_model_or_params_exclusive():
    assert validation.parse_count("1.5B") == 1.5e9 and validation.parse_count("175e9") == 175e9
    with pytest.raises(ValueError, match="Unknown parameter-count suffix in '3Q'"):
        validation.parse_count("3Q")
    with pytest.raises(ValueError, match="must be positive. Received: '-2B'"):
        validation.parse_count("-2B")
    with pytest.raises(ValueError, match="exactly one of model"):
        planner.plan("digits_cnn", parameters=1e6, batch_size=8, devices=1, device_memory="1GB", bandwidth="1Gbps")
