"""Shared fixtures: the digits CNN exported as two versions, and servers on free loopback ports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import portpicker
import pytest


@pytest.fixture(scope="session")
def digits_models() -> dict[int, Any]:
    """Version -> the Keras model exported as that version (two seeds, so versions answer differently)."""
    from tensorfleet.models import build

    return {1: build("digits_cnn", seed=0), 2: build("digits_cnn", seed=1)}


@pytest.fixture(scope="session")
def model_base(tmp_path_factory, digits_models) -> Path:
    from tensorfleet.serving import export

    base = tmp_path_factory.mktemp("models") / "digits"
    for version, model in digits_models.items():
        export(model, base, version=version)
    return base


@pytest.fixture(scope="session")
def images(digits) -> np.ndarray:
    return digits.x_test[:64].astype("float32")


def free_ports(n: int = 2) -> list[int]:
    return [portpicker.pick_unused_port() for _ in range(n)]


def start_server(base: Path, **options: Any) -> Any:
    from tensorfleet.serving import ModelServer

    grpc_port, rest_port = free_ports()
    return ModelServer(base, model_name="digits", port=grpc_port, rest_api_port=rest_port, drain_seconds=5,
                       **options).start()


@pytest.fixture(scope="module")
def server(model_base):
    """Both versions served, labels stable=1 and canary=2, no batching."""
    server = start_server(model_base, model_version_policy="all", labels={"stable": 1, "canary": 2},
                          max_request_bytes=64 * 1024)
    yield server
    server.stop()
