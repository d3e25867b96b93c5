"""Local SGD: H local steps then the mean equals independent per-replica runs averaged; all-reduces counted.

The replicas are the 2 logical CPUs of a multi-worker mirrored strategy in this process
(``compat.local_sgd.local_multi_worker_mirrored``): its all-reduces are the CollectiveReduceV2 ops of a
launched job, one per device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet.compat import keras3 as keras3_mends
from tensorfleet.compat.local_sgd import local_multi_worker_mirrored
from tensorfleet.strategies.local_sgd import LocalSGD, step_all_reduces

PER_REPLICA = 4
REPLICAS = 2


def _data(steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * PER_REPLICA * REPLICAS, 6)).astype("float32")
    y = rng.integers(0, 3, size=len(x)).astype("int64")
    return x, y


def _model(K: Any, weights: list[np.ndarray] | None = None) -> Any:
    model = K.Sequential([K.Input((6,)), K.layers.Dense(5, activation="tanh"), K.layers.Dense(3)])
    model.compile(optimizer=K.optimizers.SGD(0.5, momentum=0.5),
                  loss=K.losses.SparseCategoricalCrossentropy(from_logits=True))
    if weights is not None:
        model.set_weights(weights)
    return model


def _strategy() -> Any:
    keras3_mends.mend_fit()
    return local_multi_worker_mirrored(["/cpu:0", "/cpu:1"])


def _dataset(x: np.ndarray, y: np.ndarray) -> Any:
    # Each global batch of 8 is split in order: replica r gets its rows r*4 .. r*4+3.
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(PER_REPLICA * REPLICAS)


def _replica_rows(r: int, steps: int) -> np.ndarray:
    size = PER_REPLICA * REPLICAS
    return np.concatenate([np.arange(b * size + r * PER_REPLICA, b * size + (r + 1) * PER_REPLICA)
                           for b in range(steps)])


def _replica_weights(strategy: Any, model: Any) -> list[list[np.ndarray]]:
    from tensorfleet.compat.keras import tf_variable

    return [[p.numpy() for p in strategy.experimental_local_results(tf_variable(w))] for w in model.weights]


@pytest.fixture(params=["keras3", "keras2"])
def K(request: pytest.FixtureRequest) -> Any:
    if request.param == "keras3":
        return request.getfixturevalue("keras3")
    import tf_keras

    return tf_keras


def test_weights_after_h_steps_equal_the_mean_of_independent_replica_runs(K: Any) -> None:
    H = 3
    x, y = _data(H)
    strategy = _strategy()
    with strategy.scope():
        model = _model(K)
    start = model.get_weights()
    callback = LocalSGD(every=H, keras=model)
    model.fit(_dataset(x, y), epochs=1, verbose=0, callbacks=[callback])

    alone = []
    for r in range(REPLICAS):  # each replica's shard, trained alone for H steps from the same start
        twin = _model(K, start)
        rows = _replica_rows(r, H)
        twin.fit(x[rows], y[rows], batch_size=PER_REPLICA, epochs=1, shuffle=False, verbose=0)
        alone.append(twin.get_weights())
    assert max(np.abs(a - b).max() for a, b in zip(*alone)) > 1e-2  # the replicas really went apart
    mean = [(a + b) / 2 for a, b in zip(*alone)]
    for copies, expected in zip(_replica_weights(strategy, model), mean):
        for copy in copies:  # both replicas hold the mean (|w| < 3 here: 1e-5 is float32 over 3 steps)
            np.testing.assert_allclose(copy, expected, rtol=0, atol=1e-5)
    assert callback.runs == {"sync_steps": 0, "local_steps": H, "averaging": 1}


def test_all_reduces_are_counted_per_step_and_per_averaging(keras3: Any) -> None:
    K = keras3
    x, y = _data(8)
    strategy = _strategy()
    with strategy.scope():
        plain, local, post = _model(K), _model(K), _model(K)
    plain.fit(_dataset(x, y), epochs=2, verbose=0)
    assert step_all_reduces(plain) == 1  # Keras's step: one all-reduce of the packed gradients

    callback = LocalSGD(every=3, keras=local)
    local.fit(_dataset(x, y), epochs=2, verbose=0, callbacks=[callback])
    # 8 steps an epoch: averaged after steps 3 and 6 and at the epoch's end (8); no all-reduce in a local step
    assert callback.runs == {"sync_steps": 0, "local_steps": 16, "averaging": 6}
    assert callback.all_reduces == {"sync_steps": 0, "local_steps": 0, "averaging": 6}
    assert local.train_function is not callback._train_function  # Keras's own is back after fit

    callback = LocalSGD(every=4, sync_steps=5, keras=post)
    post.fit(_dataset(x, y), epochs=2, verbose=0, callbacks=[callback])
    # steps 1-5 synchronous (Keras's step); local from 6: averaged after 8 (epoch end), 12 and 16
    assert callback.runs == {"sync_steps": 5, "local_steps": 11, "averaging": 3}
    assert callback.all_reduces == {"sync_steps": 5, "local_steps": 0, "averaging": 3}
    assert callback.all_reduces.total() == 8
    for copies in _replica_weights(strategy, post):
        np.testing.assert_array_equal(copies[0], copies[1])  # one all-reduce result on both


def test_bad_options_and_strategies_are_refused(keras3: Any) -> None:
    K = keras3
    with pytest.raises(ValueError, match=r"every must be a positive integer. Received: every=0"):
        LocalSGD(every=0, keras="keras3")
    with pytest.raises(ValueError, match=r"sync_steps must be an integer >= 0. Received: sync_steps=-1"):
        LocalSGD(every=2, sync_steps=-1, keras="keras3")
    x, y = _data(2)
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = _model(K)
    with pytest.raises(TypeError, match=r"under OneDeviceStrategy one replica has nobody to average with"):
        model.fit(_dataset(x, y), epochs=1, verbose=0, callbacks=[LocalSGD(every=2, keras=model)])
    with _strategy().scope():
        model = _model(K)
    model.compile(optimizer="sgd", loss=K.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=2)
    with pytest.raises(ValueError, match=r"Received: steps_per_execution=2"):
        model.fit(_dataset(x, y), epochs=1, verbose=0, callbacks=[LocalSGD(every=2, keras=model)])
    import tensorfleet as tfl

    with tfl.strategies.build("mirrored", devices=["/cpu:0", "/cpu:1"], compression="fp16").scope():
        model = _model(K)
    with pytest.raises(ValueError, match=r"cannot combine with compressed gradient all-reduce. "
                                         r"Received: compression='fp16'"):
        model.fit(_dataset(x, y), epochs=1, verbose=0, callbacks=[LocalSGD(every=2, keras=model)])
    import tf_keras

    twin = _model(tf_keras)
    with pytest.raises(TypeError, match=r"is a keras3 callback and fit's model is a keras2 model"):
        twin.fit(x, y, epochs=1, verbose=0, callbacks=[LocalSGD(every=2, keras="keras3")])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_launched_workers_run_no_all_reduce_in_a_local_step_and_end_equal(tmp_path: Any, keras3: Any) -> None:
    import json
    import sys

    from tensorfleet.strategies.tf_config import ClusterSpec
    from tests.conftest import run_workers, user_env

    spec = ClusterSpec.local(workers=2)
    run_workers([[sys.executable, "-m", "tests.strategies.local_sgd_job", str(tmp_path / f"w{i}.json")]
                 for i in range(2)],
                [user_env(TF_CONFIG=spec.tf_config_json("worker", i)) for i in range(2)],
                timeout=240)
    workers = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(2)]
    for result in workers:
        # Keras 3's own step across workers: gradients, loss and accuracy logs, the iterator's end-of-data flag
        assert result["plain"]["all_reduces"] == {"per_step": 4}
        # 2 epochs of 8 steps at H=3: averaged after steps 3, 6 and 8 of each epoch; nothing in a local step
        assert result["local"]["runs"] == {"sync_steps": 0, "local_steps": 16, "averaging": 6}
        assert result["local"]["all_reduces"] == {"sync_steps": 0, "local_steps": 0, "averaging": 6}
    for a, b in zip(workers[0]["local"]["weights"], workers[1]["local"]["weights"]):
        np.testing.assert_array_equal(np.array(a), np.array(b))  # one all-reduce result on both workers


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_local_sgd_job_killed_in_epoch_3_resumes_to_the_uninterrupted_weights(tmp_path: Any) -> None:
    import signal
    from pathlib import Path

    from tensorfleet import testing
    from tensorfleet.cluster import fault_tolerance as ft
    from tensorfleet.cluster.launch_options import TaskCommand
    from tensorfleet.cluster.launcher import Recovery, TaskOutput, Timeouts, launch
    from tensorfleet.testing import Fault

    script = Path(__file__).resolve().parents[2] / "examples" / "train_digits_multiworker.py"
    # 4 steps an epoch at H=3: averaged after step 3 and at the epoch's end, so each epoch's backup holds
    # one set of weights on both workers. The user's Keras 3 in every worker (TF_USE_LEGACY_KERAS=0).
    common = ["--model", "digits_mlp", "--epochs", "4", "--examples-per-epoch", "256", "--local-sgd", "3",
              "--collective-timeout", "15", "--log-steps"]
    command, quiet = TaskCommand(env={"TF_USE_LEGACY_KERAS": "0"}), TaskOutput(log=None)
    clean = launch(script, [*common, "--weights-out", str(tmp_path / "clean.npz")], workers=2, command=command,
                   recovery=Recovery(backup_dir=tmp_path / "clean-backup"), timeouts=Timeouts(timeout=150),
                   output=quiet)
    assert clean.returncode == 0 and clean.restarts == 0
    with testing.faults(Fault("worker:1", r"^tensorfleet: epoch 3 step 2$", signal=signal.SIGKILL)):
        faulty = launch(script, [*common, "--weights-out", str(tmp_path / "faulty.npz")], workers=2, command=command,
                        recovery=Recovery(max_restarts=1, backoff=0.5, backup_dir=tmp_path / "faulty-backup"),
                        timeouts=Timeouts(timeout=150), output=quiet)
    assert faulty.returncode == 0 and faulty.restarts == 1
    for task in ("worker:0", "worker:1"):
        assert ft.resumed_epoch(faulty.output(task, attempt=1)) == 3
    clean_w, faulty_w = (np.load(tmp_path / f"{name}.npz") for name in ("clean", "faulty"))
    assert sorted(clean_w.files) == sorted(faulty_w.files) and len(clean_w.files) == 4
    difference = max(float(np.abs(clean_w[k] - faulty_w[k]).max()) for k in clean_w.files)
    # the same ops on the same batches from the same backup (op determinism): float32 rounding at most
    assert difference <= 1e-5, f"resumed weights differ from the uninterrupted run's by {difference}"
