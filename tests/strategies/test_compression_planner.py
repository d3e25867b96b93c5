"""The planner's all-reduce cost with compressed gradients: the bytes the strategies measure, through the CLI too."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from tensorfleet.cli.main import app
from tensorfleet.planner import cost_model, plans as planner
from tensorfleet.planner.workload import preset_workload, workload_from_model

CLUSTER = {"batch_size": 256, "devices": 8, "device_memory": "16GB", "bandwidth": "1Gbps",
           "network": planner.Network(nodes=2, latency="0us")}


def test_the_planner_all_reduces_the_bytes_the_strategy_hands_the_collective() -> None:
    shapes = workload_from_model("digits_cnn").gradient_shapes()
    # bytes per step measured under mirrored (tests/strategies/test_compression.py): 153128, 76564, 7296, 14280
    assert cost_model.compression_ratio("powersgd:rank=2", shapes, 4) == 153128 / 7296
    assert cost_model.compression_ratio("powersgd:rank=4", shapes, 4) == 153128 / 14280
    assert cost_model.compression_ratio("fp16", shapes, 4) == 2.0
    assert cost_model.compression_ratio("fp16", shapes, 2) == 1.0  # mixed precision's gradients are 16 bits already


def test_a_transformers_gradient_shapes_hold_all_its_parameters() -> None:
    work = preset_workload("gpt2_xl")
    assert sum(math.prod(s) for s in work.gradient_shapes()) == work.parameters


@pytest.mark.parametrize("method", ["powersgd:rank=2", "powersgd:rank=4"])
def test_plan_costs_the_compressed_all_reduce(method: str) -> None:
    plain = planner.plan("digits_cnn", **CLUSTER, training=planner.TrainingOptions(precision="float32"))
    packed = planner.plan("digits_cnn", **CLUSTER, training=planner.TrainingOptions(precision="float32",
                                                                                  compression=method))
    ratio = cost_model.compression_ratio(method, workload_from_model("digits_cnn").gradient_shapes(), 4)
    # No latency: the ring's time is its bytes over the bandwidth, so it shrinks by the ratio exactly.
    assert packed.row("data_allreduce").comm_seconds == pytest.approx(plain.row("data_allreduce").comm_seconds / ratio,
                                                                      rel=1e-12)
    assert packed.row("data_ps").comm_seconds == plain.row("data_ps").comm_seconds  # no all-reduce there
    assert f"{method} gradients" in packed.row("data_allreduce").note
    assert packed.inputs["compression"] == method


def test_plan_refuses_powersgd_under_zero_and_a_bad_method() -> None:
    with pytest.raises(ValueError, match=r"cannot shard\. Received: compression='powersgd', zero=2; use zero=0"):
        planner.plan("digits_cnn", **CLUSTER, training=planner.TrainingOptions(compression="powersgd", zero=2))
    with pytest.raises(ValueError, match="compression must be one of 'none', 'fp16', 'bf16', 'powersgd'"):
        planner.plan("digits_cnn", **CLUSTER, training=planner.TrainingOptions(compression="top-k"))


def test_cli_plan_takes_compression() -> None:
    args = ["plan", "--model", "digits_cnn", "--batch", "256", "--devices", "8", "--device-memory", "16GB",
            "--bandwidth", "1Gbps", "--precision", "float32", "--json"]
    result = CliRunner().invoke(app, [*args, "--compression", "powersgd:rank=2"])
    assert result.exit_code == 0, result.output
    assert '"compression": "powersgd:rank=2"' in result.output
