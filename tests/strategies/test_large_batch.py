"""Learning rate scaled with the global batch and warmed up; LARS and LAMB against NumPy references."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorfleet as tfl
from tensorfleet.strategies import large_batch, layerwise

# ------------------------------------------------------------------------------------------- the rules

def test_linear_and_sqrt_rules_give_the_papers_values() -> None:
    assert large_batch.scaled_lr(0.1, global_batch=512, reference_batch=32) == pytest.approx(1.6, abs=1e-15)
    assert large_batch.scaled_lr(0.1, global_batch=512, reference_batch=32, rule="sqrt") == pytest.approx(0.4,
                                                                                                       abs=1e-15)
    assert large_batch.scaled_lr(0.1, global_batch=16, reference_batch=32) == pytest.approx(0.05, abs=1e-15)


def test_warmup_is_linear_per_step_then_holds() -> None:
    got = [large_batch.warmup_lr(s, warmup_steps=4, start_lr=0.1, target_lr=1.7) for s in range(7)]
    assert got == pytest.approx([0.1, 0.5, 0.9, 1.3, 1.7, 1.7, 1.7], abs=1e-12)
    assert large_batch.warmup_lr(0, warmup_steps=0, start_lr=0.1, target_lr=1.7) == 1.7


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rule": "cubic"}, "rule must be one of 'linear', 'sqrt'. Received: rule='cubic'"),
    ({"global_batch": 0}, "global_batch must be a positive integer. Received: global_batch=0"),
    ({"reference_batch": -32}, "reference_batch must be a positive integer. Received: reference_batch=-32"),
    ({"base_lr": 0}, "base_lr must be a finite number > 0. Received: base_lr=0"),
    ({"global_batch": None}, "give one of global_batch"),
    ({"per_replica_batch": 16}, "give one of global_batch"),
    ({"warmup_epochs": 2, "warmup_steps": 10}, "give warmup_epochs or warmup_steps, not both"),
    ({"warmup_epochs": -1}, "warmup_epochs must be"),
    ({"strategy": object()}, "strategy= serves per_replica_batch only"),
])
def test_bad_input_is_one_clear_error(kwargs: dict[str, Any], message: str) -> None:
    args = {"base_lr": 0.1, "reference_batch": 32, "global_batch": 512, "keras": "keras2", **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        large_batch.scaled_learning_rate(**args)


# ------------------------------------------------------------------------------------------- the callback

def _model(K: Any, optimizer: Any) -> Any:
    model = K.Sequential([K.Input((4,)), K.layers.Dense(3)])
    model.compile(optimizer=optimizer, loss=K.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _recorder(K: Any) -> tuple[Any, list[float]]:
    seen: list[float] = []

    class Record(K.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            seen.append(float(tf.convert_to_tensor(self.model.optimizer.learning_rate)))

    return Record(), seen


_XY = (np.random.default_rng(0).random((64, 4), dtype=np.float32), np.arange(64, dtype=np.int32) % 3)


@pytest.mark.parametrize("which", ["keras2", "keras3"])
def test_callback_warms_up_per_step_to_the_scaled_rate(which: str, keras3: Any) -> None:
    K = keras3 if which == "keras3" else tf_keras
    model = _model(K, K.optimizers.SGD(0.05))
    record, seen = _recorder(K)
    # 64 examples at batch 16: 4 steps an epoch; warm-up over 2 epochs = 8 steps from 0.1 to 0.1 * 16/4 = 0.4.
    callback = large_batch.scaled_learning_rate(base_lr=0.1, reference_batch=4, global_batch=16, warmup_epochs=2,
                                                keras=model)
    model.fit(*_XY, batch_size=16, epochs=3, verbose=0, callbacks=[callback, record])
    expected = [0.1 + 0.3 * s / 8 for s in range(8)] + [0.4] * 4
    np.testing.assert_allclose(seen, expected, rtol=1e-6)
    assert callback.target_lr == pytest.approx(0.4, abs=1e-15)


@pytest.mark.parametrize("replicas", [2, 4])
def test_per_replica_batch_counts_the_replicas_of_the_model_strategy(replicas: int, logical_cpus: list[str]) -> None:
    # The same callback options on 2 then 4 replicas (a restart with more workers, keep_per_replica): the
    # rate follows the global batch of each.
    strategy = tfl.strategies.build("mirrored", devices=logical_cpus[:replicas])
    with strategy.scope():
        model = _model(tf_keras, tf_keras.optimizers.SGD(0.05))
    record, seen = _recorder(tf_keras)
    callback = large_batch.scaled_learning_rate(base_lr=0.1, reference_batch=8, per_replica_batch=8, rule="sqrt",
                                                keras=model)
    model.fit(*_XY, batch_size=8 * replicas, epochs=1, verbose=0, callbacks=[callback, record])
    assert callback.global_batch == 8 * replicas
    np.testing.assert_allclose(seen, [0.1 * math.sqrt(replicas)] * (64 // (8 * replicas)), rtol=1e-6)


def test_a_resumed_fit_continues_the_warmup_where_its_epoch_is() -> None:
    # Resumed at epoch 1 of a 2-epoch warm-up (4 steps an epoch): steps 4..7 of the ramp, then the target.
    model = _model(tf_keras, tf_keras.optimizers.SGD(0.05))
    record, seen = _recorder(tf_keras)
    callback = large_batch.scaled_learning_rate(base_lr=0.1, reference_batch=4, global_batch=16, warmup_epochs=2,
                                                keras=model)
    model.fit(*_XY, batch_size=16, epochs=3, initial_epoch=1, verbose=0, callbacks=[callback, record])
    np.testing.assert_allclose(seen, [0.1 + 0.3 * s / 8 for s in range(4, 8)] + [0.4] * 4, rtol=1e-6)


@pytest.mark.parametrize("which", ["keras2", "keras3"])
def test_a_schedule_learning_rate_is_refused_naming_it(which: str, keras3: Any) -> None:
    K = keras3 if which == "keras3" else tf_keras
    model = _model(K, K.optimizers.SGD(K.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)))
    callback = large_batch.scaled_learning_rate(base_lr=0.1, reference_batch=4, global_batch=16, keras=model)
    with pytest.raises(TypeError, match="SGD's learning rate is a schedule it cannot set. Received: "
                                        "learning_rate='ExponentialDecay'"):
        model.fit(*_XY, batch_size=16, epochs=1, verbose=0, callbacks=[callback])


def test_the_callback_of_one_keras_refuses_a_model_of_the_other(keras3: Any) -> None:
    model = _model(tf_keras, "sgd")
    callback = large_batch.scaled_learning_rate(base_lr=0.1, reference_batch=4, global_batch=16, keras="keras3")
    assert isinstance(callback, keras3.callbacks.Callback)
    with pytest.raises(TypeError, match="is a keras3 callback and fit's model is a keras2 model"):
        model.fit(*_XY, batch_size=16, epochs=1, verbose=0, callbacks=[callback])


# ------------------------------------------------------------------------------------------- LARS and LAMB

def _norm(a: np.ndarray) -> float:
    return float(np.sqrt(np.sum(a.astype(np.float64) ** 2)))


def _ratio(num: float, w_norm: float, u_norm: float, den: float) -> float:
    return num / den if w_norm > 0 and u_norm > 0 else 1.0


def _lars_reference(w: np.ndarray, grads: list[np.ndarray], lr: float, mu: float, eta: float, wd: float) -> np.ndarray:
    w, v = w.astype(np.float64), np.zeros(w.shape)
    for g in grads:
        if w.ndim > 1:
            wn, gn = _norm(w), _norm(g)
            v = mu * v + lr * _ratio(eta * wn, wn, gn, gn + wd * wn) * (g + wd * w)
        else:
            v = mu * v + lr * g
        w = w - v
    return w


def _lamb_reference(w: np.ndarray, grads: list[np.ndarray], lr: float, b1: float, b2: float, eps: float,
                    wd: float) -> np.ndarray:
    w, m, v = w.astype(np.float64), np.zeros(w.shape), np.zeros(w.shape)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        r = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        if w.ndim > 1:
            r = r + wd * w
            w = w - lr * _ratio(_norm(w), _norm(w), _norm(r), _norm(r)) * r
        else:
            w = w - lr * r
    return w


def _steps(K: Any, optimizer: Any, initial: list[np.ndarray], grads: list[list[np.ndarray]]) -> list[np.ndarray]:
    variables = [K.Variable(w) if K is not tf_keras else tf.Variable(w) for w in initial]
    for step in grads:
        optimizer.apply_gradients([(tf.constant(g), var) for g, var in zip(step, variables)])
    return [np.asarray(var.numpy() if hasattr(var, "numpy") else var) for var in variables]


_RNG = np.random.default_rng(1)
_INITIAL = [_RNG.normal(size=(5, 3)).astype(np.float32), _RNG.normal(size=(3,)).astype(np.float32)]
_GRADS = [[_RNG.normal(size=w.shape).astype(np.float32) for w in _INITIAL] for _ in range(3)]


@pytest.mark.parametrize("which", ["keras2", "keras3"])
def test_lars_steps_equal_the_numpy_reference(which: str, keras3: Any) -> None:
    K = keras3 if which == "keras3" else tf_keras
    optimizer = layerwise.lars(0.5, momentum=0.9, eta=0.02, weight_decay=0.01, keras=which)
    got = _steps(K, optimizer, _INITIAL, _GRADS)
    for index, (w, g) in enumerate(zip(got, zip(*_GRADS))):
        want = _lars_reference(_INITIAL[index], list(g), 0.5, 0.9, 0.02, 0.01)
        np.testing.assert_allclose(w, want, rtol=2e-6, atol=2e-6)
    assert not np.allclose(got[0], _INITIAL[0]) and not np.allclose(got[1], _INITIAL[1])


def test_tf_keras_lamb_steps_equal_the_numpy_reference() -> None:
    optimizer = layerwise.lamb(0.01, beta_1=0.8, beta_2=0.95, epsilon=1e-6, weight_decay=0.05, keras="keras2")
    assert isinstance(optimizer, tf_keras.optimizers.Optimizer)
    got = _steps(tf_keras, optimizer, _INITIAL, _GRADS)
    for index, (w, g) in enumerate(zip(got, zip(*_GRADS))):
        want = _lamb_reference(_INITIAL[index], list(g), 0.01, 0.8, 0.95, 1e-6, 0.05)
        np.testing.assert_allclose(w, want, rtol=2e-6, atol=2e-6)


def test_keras3_lamb_is_keras_own(keras3: Any) -> None:
    assert layerwise.optimizer_class("lamb", "keras3") is keras3.optimizers.Lamb
    assert layerwise.optimizer_class("LARS", "keras3").__name__ == "LARS"


@pytest.mark.parametrize(("call", "message"), [
    (lambda: layerwise.optimizer_class("adamw", "keras2"),
     "name must be one of 'LARS', 'LAMB'. Received: name='adamw'"),
    (lambda: layerwise.lars(0.1, momentum=1.5, keras="keras2"), "momentum must be"),
    (lambda: layerwise.lars(0.1, eta=0, keras="keras3"), "eta must be a finite number > 0. Received: eta=0"),
    (lambda: layerwise.lamb(beta_2=1.0, keras="keras2"), "beta_2 must be"),
])
def test_bad_optimizer_options_are_refused(call: Any, message: str, keras3: Any) -> None:
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(("which", "name"), [("keras2", "LARS"), ("keras3", "LARS"), ("keras2", "LAMB")])
def test_a_model_trains_with_them_under_mirrored(which: str, name: str, keras3: Any, logical_cpus: list[str],
                                                 digits_flat: Any) -> None:
    K = keras3 if which == "keras3" else tf_keras
    x, y = digits_flat.x_train[:512], digits_flat.y_train[:512]
    strategy = tfl.strategies.build("mirrored", devices=logical_cpus[:2])
    with strategy.scope():
        model = K.Sequential([K.Input((64,)), K.layers.Dense(32, activation="relu"), K.layers.Dense(10)])
        optimizer = (layerwise.lars(1.0, eta=0.01, keras=which) if name == "LARS"
                     else layerwise.lamb(0.05, weight_decay=0.01, keras=which))
        model.compile(optimizer=optimizer, loss=K.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(x, y, batch_size=64, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses
    assert history.history["accuracy"][-1] > 0.7


_SAVE = """
import sys, keras, numpy as np, tf_keras
import tensorfleet as tfl
for K, which, names in ((keras, "keras3", ("LARS",)), (tf_keras, "keras2", ("LARS", "LAMB"))):
    for name in names:
        model = K.Sequential([K.Input((3,)), K.layers.Dense(2)])
        opt = (tfl.strategies.lars(0.5, momentum=0.8, eta=0.02, keras=which) if name == "LARS"
               else tfl.strategies.lamb(0.01, weight_decay=0.03, keras=which))
        model.compile(optimizer=opt, loss="mse")
        model.fit(np.ones((1, 3), "float32"), np.ones((1, 2), "float32"), epochs=1, verbose=0)
        model.save(f"{sys.argv[1]}/{which}_{name}.keras")
"""

_LOAD = """
import sys, keras, tf_keras
try:
    keras.saving.load_model(f"{sys.argv[1]}/keras3_LARS.keras")
except Exception as error:
    print("unregistered:", type(error).__name__)
import tensorfleet.strategies.layerwise
for K, which, name in ((keras, "keras3", "LARS"), (tf_keras, "keras2", "LARS"), (tf_keras, "keras2", "LAMB")):
    opt = K.models.load_model(f"{sys.argv[1]}/{which}_{name}.keras").optimizer
    config = opt.get_config()
    print(which, type(opt).__name__, type(opt).__module__, round(float(config["learning_rate"]), 6),
          config.get("eta"), config.get("momentum"), config.get("weight_decay"), int(opt.iterations.numpy()))
"""


@pytest.mark.slow
def test_a_model_saved_with_lars_or_lamb_loads_in_a_new_process_without_custom_objects(tmp_path: Any,
                                                                                       keras3: Any) -> None:
    import subprocess
    import sys

    from tests.conftest import user_env

    for code in (_SAVE, _LOAD):
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=user_env(), capture_output=True,
                              text=True, timeout=240, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines == [
        "unregistered: TypeError",  # Keras needs the module that registers them imported: that is the test's point
        "keras3 LARS tensorfleet.compat.layerwise 0.5 0.02 0.8 0.0001 1",
        "keras2 LARS tensorfleet.compat.layerwise 0.5 0.02 0.8 0.0001 1",
        "keras2 LAMB tensorfleet.compat.layerwise 0.01 None None 0.03 1",
    ], done.stdout


# ------------------------------------------------------------------- launch --scale-lr / fault_tolerance.callbacks

def test_scale_lr_specs_are_parsed_or_refused_naming_the_form() -> None:
    assert large_batch.parse_scale_lr(" Linear:256 ") == (large_batch.ScalingRule.LINEAR, 256)
    for bad in ("linear", "cubic:64", "sqrt:0", "sqrt:-4", "sqrt:6.5", ""):
        with pytest.raises(ValueError, match=r"--scale-lr must be RULE:REFERENCE_BATCH .* Received: --scale-lr="):
            large_batch.parse_scale_lr(bad, name="--scale-lr")


@pytest.mark.parametrize("which", ["keras3", "keras2"])
def test_the_launchers_scale_lr_gives_each_start_the_rate_of_its_global_batch(which: str, keras3: Any, tmp_path: Any,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorfleet.cluster import fault_tolerance
    from tensorfleet.cluster.contract import ENV_SCALE_LR

    K = keras3 if which == "keras3" else tf_keras
    monkeypatch.setenv(ENV_SCALE_LR, "linear:64")
    rates = []
    for global_batch in (64, 128, 32):  # a first start, then elastic restarts under keep_per_replica
        model = K.Sequential([K.Input((4,)), K.layers.Dense(2)])
        model.compile(optimizer=K.optimizers.SGD(0.05), loss="mse")  # the script's rate, for the reference 64
        cbs = fault_tolerance.callbacks(tmp_path / "backup", keras=model, global_batch_size=global_batch, log=False)
        assert type(cbs[0]).__name__ == "BackupAndRestore" and type(cbs[1]).__name__ == "LearningRateScaling"
        model.fit(np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"), batch_size=8, epochs=1, verbose=0,
                  callbacks=[cbs[1]])
        rates.append(float(np.asarray(model.optimizer.learning_rate)))
    assert rates == pytest.approx([0.05, 0.1, 0.025], rel=1e-6)  # float32 variable
    with pytest.raises(ValueError, match=r"needs global_batch_size= and keras=the compiled model"):
        fault_tolerance.callbacks(tmp_path / "backup", keras=which)
    monkeypatch.delenv(ENV_SCALE_LR)
    assert [type(c).__name__ for c in fault_tolerance.callbacks(tmp_path / "backup", keras=which, log=False)] == [
        "BackupAndRestore"]


def test_launch_refuses_a_bad_scale_lr_in_every_mode(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    from tensorfleet.cli.main import main

    script = tmp_path / "job.py"
    script.write_text("print('ran')\n")
    assert main(["launch", "--workers", "1", "--scale-lr", "linear", str(script)]) == 2
    assert ("--scale-lr must be RULE:REFERENCE_BATCH with RULE linear or sqrt and the global batch the learning "
            "rate is for, e.g. 'linear:64'. Received: --scale-lr='linear'") in capsys.readouterr().err
    assert main(["launch", "--strategy", "mirrored", "--scale-lr", "sqrt:0", str(script)]) == 2
    assert "Received: --scale-lr='sqrt:0'" in capsys.readouterr().err
    from tensorfleet.cluster.migration import RunOptions, TaskOptions

    with pytest.raises(ValueError, match=r"Received: scale_lr='linear:x'"):
        RunOptions(scale_lr="linear:x")
    task = TaskOptions(scale_lr="sqrt:32", out_dir=str(tmp_path), strategy="mirrored")
    assert TaskOptions.from_env(task.to_env()).scale_lr == "sqrt:32"  # reaches the trainer task
