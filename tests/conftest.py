"""Session-wide test set-up.

The whole suite shares one process, and TensorFlow's logical devices can only be split before
its runtime starts, so the split (4 logical CPUs: enough for mirrored over 2 and 4, a 2x2
mesh, 4 pipeline stages) happens here, before any test imports TensorFlow.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402

NUM_LOGICAL_CPUS = 4


def pytest_configure(config: pytest.Config) -> None:
    from tensorfleet.strategies.devices import simulate_devices

    simulate_devices(NUM_LOGICAL_CPUS)


@pytest.fixture(scope="session")
def logical_cpus() -> list[str]:
    from tensorfleet.strategies.devices import logical_device_names

    names = logical_device_names("CPU")
    assert len(names) == NUM_LOGICAL_CPUS
    return names
