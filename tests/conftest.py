"""Session-wide test set-up.

The whole suite shares one process, and TensorFlow's logical devices can only be split before
its runtime starts, so the split (4 logical CPUs: enough for mirrored over 2 and 4, a 2x2
mesh, 4 pipeline stages) happens here, before any test imports TensorFlow.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")
# The suite's process is a user's default process: no TF_USE_LEGACY_KERAS (removed here, before TensorFlow starts,
# should the shell have it), so `tf.keras` is Keras 3 where Keras 3 is installed; tensorfleet itself never sets it
# (tests/test_compat.py holds that). Every test names its Keras: `import keras` (the `keras3` fixture) for Keras 3,
# Keras 2 through `tensorfleet.compat.keras.keras2()` or `keras="tf_keras"` to the zoo (tf_keras; tf.keras on the
# tff track), `user_env()` for a child that is a user's default process and `keras2_env()` for a child whose
# `tf.keras` is Keras 2 (what Keras Tuner needs to drive tf_keras).
os.environ.pop("TF_USE_LEGACY_KERAS", None)

import pytest  # noqa: E402

NUM_LOGICAL_CPUS = 4
# `make test-fast` runs the unit tier: no test there starts a process (those are marked slow).
FAST_TIER = os.environ.get("TENSORFLEET_TEST_TIER") == "fast"


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist (make test-fast's -n 2) each worker is a process of its own that runs this hook too, and
    # splits its own CPU; the controller only hands out tests and runs none, so it does not start TensorFlow.
    distributing = getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None))
    if distributing and not hasattr(config, "workerinput"):
        return
    from tensorfleet.strategies.devices import simulate_devices

    simulate_devices(NUM_LOGICAL_CPUS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `make test` selects by marker (-m "not tff" on the current track, -m tff on the tff track); a
    # plain pytest run on the current track skips what needs TFF instead of failing on its import.
    from tensorfleet.compat.tff import tff_available

    if tff_available():
        return
    skip = pytest.mark.skip(reason="needs tensorflow-federated: the tff track runs it (make test-tff)")
    for item in items:
        if "tff" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """In the fast tier, a test that starts a process fails at once, naming the fix: mark it slow. The guard spans
    the item's whole set-up, so a module- or session-scoped fixture that starts one is caught too."""
    if not FAST_TIER or "slow" in item.keywords:
        yield
        return
    import multiprocessing.process
    import subprocess

    # Both ways a process starts: subprocess (scripts, launched tasks, servers) and multiprocessing (spawned workers).
    popen, start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def refuse(*args: Any, **kwargs: Any) -> None:
        what = args[1] if len(args) > 1 else kwargs.get("args", args[0])
        pytest.fail(f"{item.nodeid} starts a process ({what!r}), in the test or one of its fixtures; the fast tier "
                    "(make test-fast) starts none: mark the test slow", pytrace=False)

    subprocess.Popen.__init__ = refuse  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = popen  # type: ignore[method-assign]
        multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """A test (or a fixture it used) that leaves TF_USE_LEGACY_KERAS set fails in its teardown, naming itself: the
    suite's process is a user's default one, and a later test in the same process would see tf_keras chosen."""
    result = yield
    leaked = os.environ.pop("TF_USE_LEGACY_KERAS", None)
    if leaked is not None:
        raise AssertionError(f"{item.nodeid} left TF_USE_LEGACY_KERAS={leaked!r} in the suite's process (removed "
                             "now): set it with monkeypatch.setenv, or in a child's environment only")
    return result


@pytest.fixture(scope="session")
def logical_cpus() -> list[str]:
    from tensorfleet.strategies.devices import logical_device_names

    names = logical_device_names("CPU")
    assert len(names) == NUM_LOGICAL_CPUS
    return names


@pytest.fixture(scope="session")
def keras3() -> Any:
    """The Keras 3 package (installed beside tf_keras on the current track); the test is skipped where Keras
    is 2.x (the tff track's Keras 2.14), since only Keras 3 models are what the entry points refuse."""
    import tensorflow as tf  # noqa: F401  (Keras 3's TensorFlow backend)

    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3."):
        pytest.skip(f"Keras 3 is not installed here (keras {keras.__version__}: the tff track)")
    return keras


@pytest.fixture(scope="session")
def keras3_model(keras3: Any) -> Any:
    """A small Keras 3 model, for the tests that every entry point taking a model refuses it."""
    return keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)])


@pytest.fixture(scope="session")
def digits() -> Any:
    """scikit-learn's digits as 8x8x1 images, split and shuffled once for the session."""
    from tensorfleet.models.datasets import load_digits

    return load_digits()


@pytest.fixture(scope="session")
def digits_flat() -> Any:
    """The same digits as 64-value vectors, for the MLPs."""
    from tensorfleet.models.datasets import load_digits

    return load_digits(flat=True)


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's process on today's TensorFlow: this one's without ``TF_USE_LEGACY_KERAS``
    (so ``tf.keras`` is Keras 3 where Keras 3 is installed), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(extra)
    return env


def keras2_env(**extra: str) -> dict[str, str]:
    """The environment of a process whose ``tf.keras`` is Keras 2, chosen as a user chooses it
    (``TF_USE_LEGACY_KERAS=1`` before TensorFlow starts), plus ``extra``: for child scripts written with
    ``tf.keras`` for Keras 2."""
    return {**os.environ, "TF_USE_LEGACY_KERAS": "1", **extra}


def reap(process: Any) -> None:
    """Kills ``process`` (a ``subprocess.Popen``) if it still runs, and waits for it: no test leaves a child."""
    if process.poll() is None:
        process.kill()
        process.wait()


def collect_workers(commands: list[list[str]], envs: list[dict[str, str]], *,
                    timeout: float) -> tuple[list[Any], list[str]]:
    """Runs each command (with its environment, from the project root) at once and returns the
    processes and their output, whatever their exit statuses. None outlives the call (bounded by
    ``timeout`` seconds): each runs in its own session, killed with its children if still running."""
    import signal
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    procs = []
    try:
        for command, env in zip(commands, envs):
            procs.append(subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, start_new_session=True))
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return procs, logs


def run_workers(commands: list[list[str]], envs: list[dict[str, str]], *, timeout: float) -> list[str]:
    """:func:`collect_workers`, and every process must have exited 0 (the assertion shows the last
    lines of each that did not)."""
    procs, logs = collect_workers(commands, envs, timeout=timeout)
    failed = [f"worker {index} exited {p.returncode}:\n{log[-3000:]}"
              for index, (p, log) in enumerate(zip(procs, logs)) if p.returncode != 0]
    assert not failed, "\n\n".join(failed)
    return logs


def compile_digits(model: Any) -> None:
    from tensorfleet.compat.keras import module_of

    keras = module_of(model)  # the optimizer and loss of the model's own Keras
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def test_accuracy(model: Any, split: Any) -> float:
    import numpy as np

    predictions = model.predict(split.x_test, verbose=0, batch_size=128)
    return float(np.mean(np.argmax(predictions, axis=1) == split.y_test))


test_accuracy.__test__ = False  # a helper, not a test
