"""`auto` picks the strategy each environment calls for."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tensorfleet as tfl
from tensorfleet.strategies.tf_config import ClusterSpec

ROOT = Path(__file__).resolve().parents[2]


def env_with(spec: ClusterSpec | None, role: str = "worker", index: int = 0) -> dict[str, str]:
    return {"TF_CONFIG": spec.tf_config_json(role, index) if spec else ""}


def test_tf_config_with_ps_tasks_chooses_parameter_server() -> None:
    spec = ClusterSpec.local(workers=2, ps=1, chief=True, ports=[1001, 1002, 1003, 1004])
    assert tfl.strategies.choose(env_with(spec, "chief")) == ("parameter_server", "TF_CONFIG has 1 ps task(s)")


def test_tf_config_with_several_workers_chooses_multi_worker_mirrored() -> None:
    spec = ClusterSpec.local(workers=2, ports=[1001, 1002])
    assert tfl.strategies.choose(env_with(spec)) == ("multi_worker_mirrored", "TF_CONFIG has 2 workers")
    spec = ClusterSpec.local(workers=1, chief=True, ports=[1001, 1002])
    assert tfl.strategies.choose(env_with(spec, "chief"))[0] == "multi_worker_mirrored"


def test_tpu_name_chooses_tpu() -> None:
    assert tfl.strategies.choose({"TF_CONFIG": "", "TPU_NAME": "my-tpu"}) == ("tpu", "TPU_NAME=my-tpu")


def test_several_local_devices_choose_mirrored(logical_cpus) -> None:
    assert tfl.strategies.choose({}) == ("mirrored", "4 local CPU devices")


def test_single_worker_tf_config_falls_through_to_local_devices() -> None:
    spec = ClusterSpec.local(workers=1, ports=[1001])
    assert tfl.strategies.choose(env_with(spec))[0] == "mirrored"


def test_invalid_tf_config_is_reported_not_ignored() -> None:
    with pytest.raises(tfl.strategies.TFConfigError, match="TF_CONFIG is not valid JSON"):
        tfl.strategies.choose({"TF_CONFIG": "{'cluster': 1}"})


def test_auto_builds_and_logs_its_choice(caplog, monkeypatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    with caplog.at_level(logging.INFO, logger="tensorfleet.strategies.auto"):
        strategy = tfl.strategies.build("auto")
    assert type(strategy).__name__ == "MirroredStrategy" and strategy.num_replicas_in_sync == 4
    assert "tensorfleet auto strategy: chose 'mirrored' because 4 local CPU devices" in caplog.text


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_one_local_device_chooses_one_device() -> None:
    code = ("import json, tensorfleet as tfl, tensorflow as tf; s = tfl.strategies.build('auto'); "
            "print(json.dumps([tfl.strategies.choose()[0], type(s).__name__]))")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TPU_NAME")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=110)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["one_device", "OneDeviceStrategy"]
