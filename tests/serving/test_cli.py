"""`tensorfleet serving export` and `tensorfleet serve` through the CLI: the stated names, clear
errors, and a served process that drains a request in flight on SIGTERM and exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tensorfleet.cli.main import main
from tests.conftest import reap

from .conftest import assert_float32_close, free_ports


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory, digits_models) -> Path:
    path = tmp_path_factory.mktemp("keras") / "digits.keras"
    digits_models[1].save(path)
    return path


def test_serving_export_writes_the_version_and_prints_the_names(keras_file, tmp_path, capsys):
    assert main(["serving", "export", str(keras_file), str(tmp_path / "digits"), "--version", "4"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"exported version 4 to {tmp_path / 'digits' / '4'} (signature 'serving_default')",
        "  input  image: float32[None, 8, 8, 1]",
        "  output logits: float32[None, 10]",
    ]
    assert (tmp_path / "digits" / "4" / "saved_model.pb").is_file()


def test_bad_arguments_end_in_one_clear_line(keras_file, tmp_path, capsys):
    assert main(["serving", "export", str(keras_file), str(tmp_path), "--version", "0"]) == 2
    assert capsys.readouterr().err == "error: --version must be a positive integer. Received: --version=0\n"
    assert main(["serving", "export", str(tmp_path / "none.keras"), str(tmp_path)]) == 2
    assert "error: No Keras model at" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == (f"error: No folder at {str(tmp_path / 'missing')!r}: nothing is there; "
                                         "expected a model base directory (BASE/<version>/saved_model.pb).\n")
    assert main(["serve", str(tmp_path), "--port", "70000"]) == 2
    assert capsys.readouterr().err == "error: port must be an integer from 1 to 65535. Received: port=70000\n"
    assert main(["serve", str(tmp_path), "--label", "stable"]) == 2
    assert "--label takes LABEL=VERSION" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--min-replicas", "1"]) == 2
    assert capsys.readouterr().err == ("error: --min-replicas and --max-replicas go together (elastic serving). "
                                       "Received: --min-replicas=1, --max-replicas=None\n")
    assert main(["serve", str(tmp_path), "--tensorflow-intra-op-parallelism", "-1"]) == 2
    assert capsys.readouterr().err == ("error: --tensorflow-intra-op-parallelism must be an integer >= 0. "
                                       "Received: --tensorflow-intra-op-parallelism=-1\n")
    assert main(["serve", str(tmp_path), "--min-replicas", "0", "--max-replicas", "0"]) == 2
    assert capsys.readouterr().err == "error: --max-replicas must be a positive integer. Received: --max-replicas=0\n"
    config = tmp_path / "models.config"
    assert main(["serve", str(tmp_path), "--model-config-file", str(config)]) == 2
    assert capsys.readouterr().err.startswith("error: Serve BASE or --model-config-file, one of the two.")
    config.write_text('model_config_list { config { name: "a" } }')
    assert main(["serve", "--model-config-file", str(config)]) == 2
    assert capsys.readouterr().err == (f"error: {config}: every config needs a name and a base_path. "
                                       "Received: name='a', base_path=''\n")
    config.write_text("model_config_list { config { nme: 1 } }")
    assert main(["serve", "--model-config-file", str(config)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {config} is not a text-format ModelServerConfig: ")
    assert main(["serve", str(tmp_path), "--batching-policy", "eager"]) == 2
    assert "'eager' is not one of 'adaptive', 'timeout'" in capsys.readouterr().err


def _wait_for_line(process: subprocess.Popen, text: str, timeout: float = 60) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if text in line:
            return lines
    raise AssertionError(f"{text!r} not printed within {timeout}s: {lines}")


def _wait_in_flight(port: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/monitoring/prometheus/metrics", timeout=10) as reply:
            if ':tensorflow:serving:requests_in_flight{model_name="digits"} 1' in reply.read().decode():
                return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_sigterm_drains_the_request_in_flight_then_exits(model_base, digits_models, images):
    grpc_port, rest_port = free_ports()
    # A lone request waits the whole batch timeout (3 s) for others: SIGTERM lands while it is in flight.
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorfleet.cli.main", "serve", str(model_base), "--model-name", "digits",
         "--port", str(grpc_port), "--rest-api-port", str(rest_port), "--enable-batching",
         "--batch-timeout-micros", "3000000"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait_for_line(process, "[serve] batching:")
        reply: dict = {}

        def predict() -> None:
            body = json.dumps({"instances": images[:3].tolist()}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{rest_port}/v1/models/digits:predict", data=body)
            with urllib.request.urlopen(request, timeout=30) as response:
                reply.update(status=response.status, body=json.loads(response.read()))

        caller = threading.Thread(target=predict)
        caller.start()
        assert _wait_in_flight(rest_port), "the request never reached the server"
        process.send_signal(signal.SIGTERM)
        caller.join(30)
        assert process.wait(30) == 0
        assert reply["status"] == 200
        assert_float32_close(np.array(reply["body"]["predictions"], np.float32),
                             digits_models[2].predict(images[:3], verbose=0))
        rest = process.stdout.read().splitlines()
        assert rest == ["[serve] stopping: draining requests in flight", "[serve] stopped"]
    finally:
        reap(process)


@pytest.fixture(scope="module")
def staged_base(tmp_path_factory, digits_models) -> Path:
    from tensorfleet.serving import export

    base = tmp_path_factory.mktemp("staged-cli") / "digits"
    export(digits_models[1], base, version=1, stages=2)
    return base


def test_a_port_in_use_ends_in_one_clear_line(model_base, capsys):
    import socket

    grpc_port, rest_port = free_ports()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", rest_port))
        busy.listen()
        assert main(["serve", str(model_base), "--port", str(grpc_port), "--rest-api-port", str(rest_port)]) == 2
    captured = capsys.readouterr()
    err = captured.err
    out = captured.out.splitlines()
    assert out[0].startswith("[serve] loaded 'digits' version(s) "), out
    assert not any(line.startswith("[serve] stop") for line in out), out  # it never served: nothing was stopped
    assert err.startswith(f"error: Could not serve REST on 127.0.0.1:{rest_port}: ") and err.count("\n") == 1, err
    assert "address already in use" in err


def test_stage_devices_errors_end_in_one_clear_line(staged_base, capsys):
    assert main(["serve", str(staged_base), "--stages", "2", "--stage-devices", "/cpu:0"]) == 2
    assert capsys.readouterr().err == ("error: Give one device per stage: 2 stage(s), 1 device(s). "
                                       "Received: stage_devices=['/cpu:0']\n")
    assert main(["serve", str(staged_base), "--stages", "2", "--stage-devices", "/cpu:0,"]) == 2
    assert capsys.readouterr().err == ("error: --stage-devices takes comma-separated device names, e.g. "
                                       "/cpu:0,/cpu:1. Received: '/cpu:0,'\n")
    assert main(["serve", str(staged_base), "--stages", "2", "--stage-devices", "/cpu:0,/tpu:0"]) == 2
    assert capsys.readouterr().err.startswith("error: Unknown stage device '/tpu:0'; this process has [")


@pytest.mark.slow
def test_serve_places_each_stage_on_a_logical_cpu_it_makes(staged_base, digits_models, images):
    grpc_port, rest_port = free_ports()
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorfleet.cli.main", "serve", str(staged_base), "--model-name", "digits",
         "--port", str(grpc_port), "--rest-api-port", str(rest_port), "--stages", "2",
         "--stage-devices", "/cpu:0,/cpu:1", "--file-system-poll-wait-seconds", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        lines = _wait_for_line(process, "[serve] batching:")
        assert "[serve] stages: 2, 4 micro-batches per request, on /device:CPU:0, /device:CPU:1" in lines
        body = json.dumps({"instances": images[:4].tolist()}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{rest_port}/v1/models/digits:predict", data=body)
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert_float32_close(np.array(json.loads(reply.read())["predictions"], np.float32),
                                 digits_models[1].predict(images[:4], verbose=0))
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        reap(process)
