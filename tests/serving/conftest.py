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


# A served answer is float32 computed in another order than ``model.predict``'s: the server runs the
# signature on a batch of another size (batching, replicas, stages) and a batch of another size sums in
# another order on some CPUs (an AMD EPYC with AVX2 and no AVX-512: 6e-8 to 7.5e-8 apart). A few float32
# epsilons (1.2e-7) of the values' magnitude cover that; 1e-5 of it leaves room for longer sums, while a
# wrong row or a wrong version (logits O(1) apart) still fails by orders of magnitude.
FLOAT32_RTOL = 1e-5


def assert_float32_close(actual: Any, expected: Any) -> None:
    """``actual`` equals ``expected`` up to float32 rounding in another summation order (same shape)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    np.testing.assert_allclose(actual, expected, rtol=FLOAT32_RTOL, atol=FLOAT32_RTOL * scale)




def free_ports(n: int = 2) -> list[int]:
    return [portpicker.pick_unused_port() for _ in range(n)]


def start_server(base: Path, **options: Any) -> Any:
    from tensorfleet.serving import FrontOptions, ModelServer

    grpc_port, rest_port = free_ports()
    options.setdefault("front", FrontOptions(drain_seconds=5))
    return ModelServer(base, model_name="digits", port=grpc_port, rest_api_port=rest_port, **options).start()


@pytest.fixture(scope="module")
def server(model_base):
    """Both versions served, labels stable=1 and canary=2, no batching."""
    from tensorfleet.serving import FrontOptions, VersionOptions

    server = start_server(model_base, versions=VersionOptions(policy="all", labels={"stable": 1, "canary": 2}),
                          front=FrontOptions(max_request_bytes=64 * 1024, drain_seconds=5))
    yield server
    server.stop()
