"""Compressed all-reduce: the bytes handed to the collective, fp16 against the plain sum, PowerSGD against NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import tensorfleet as tfl
from tensorfleet.strategies import compression

# The digits CNN's gradients: kernels (3,3,1,16) (3,3,16,32) (512,64) (64,10), biases 16+32+64+10, float32.
DIGITS_SHAPES = [(3, 3, 1, 16), (16,), (3, 3, 16, 32), (32,), (512, 64), (64,), (64, 10), (10,)]
PLAIN_BYTES = 38282 * 4
# PowerSGD rank 2: biases 122 values + Ps (9+144+512+64)*2 in the first call, Qs (16+32+64+10)*2 in the second.
POWERSGD2_CALLS = [(122 + 729 * 2) * 4, 122 * 2 * 4]
# Rank 4: the 9 x 16 kernel saves too little ((9+16)*4 = 100 > 144/2) and goes whole with the biases.
POWERSGD4_CALLS = [(122 + 144 + (144 + 512 + 64) * 4) * 4, (32 + 64 + 10) * 4 * 4]


def _fit_one_step(K: Any, strategy: Any, digits: Any, *, lr: float = 0.1) -> Any:
    with strategy.scope():
        model = tfl.models.build("digits_cnn", keras=K.__name__)
        model.compile(optimizer=K.optimizers.SGD(lr), loss=K.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(digits.x_train[:64], digits.y_train[:64], batch_size=64, epochs=1, shuffle=False, verbose=0)
    return model


@pytest.mark.parametrize(("method", "calls"), [
    ("none", [PLAIN_BYTES]), ("fp16", [PLAIN_BYTES // 2]), ("bf16", [PLAIN_BYTES // 2]),
    ("powersgd:rank=2", POWERSGD2_CALLS), ("powersgd:rank=4", POWERSGD4_CALLS)])
def test_bytes_handed_to_the_collective_are_exact(keras3: Any, logical_cpus: list[str], digits: Any,
                                                  method: str, calls: list[int]) -> None:
    strategy = tfl.strategies.build("mirrored", devices=logical_cpus[:2], compression=method)
    model = _fit_one_step(keras3, strategy, digits)
    got = compression.traffic(model)
    assert (got.calls, got.gradient_bytes) == (calls, PLAIN_BYTES)
    assert compression.compressed_bytes(method, DIGITS_SHAPES) == sum(calls)  # the planner's arithmetic agrees


def test_tf_keras_gradients_take_the_same_path(logical_cpus: list[str], digits: Any) -> None:
    import tf_keras

    strategy = tfl.strategies.build("mirrored", devices=logical_cpus[:2], compression="powersgd:rank=2")
    model = _fit_one_step(tf_keras, strategy, digits)
    assert compression.traffic(model).calls == POWERSGD2_CALLS


def test_fp16_sum_equals_the_plain_sum_within_fp16_rounding(keras3: Any, logical_cpus: list[str],
                                                            digits: Any) -> None:
    lr = 0.1
    start = tfl.models.build("digits_cnn", keras="keras3").get_weights()
    after = {}
    for method in ("none", "fp16"):
        model = _fit_one_step(keras3, tfl.strategies.build("mirrored", devices=logical_cpus[:2], compression=method),
                              digits, lr=lr)
        after[method] = model.get_weights()
    for w0, plain, half in zip(start, after["none"], after["fp16"]):
        step = np.abs(plain - w0).max()
        # Each addend and the sum rounded to 11 significant bits: at most ~3 * 2**-11 of the largest step.
        np.testing.assert_allclose(half, plain, rtol=0, atol=4 * 2.0**-11 * step + 1e-7)
        assert not np.array_equal(plain, w0)
    assert any(not np.array_equal(h, p) for h, p in zip(after["fp16"], after["none"]))  # 16 bits were sent


# ------------------------------------------------------------------------------------------- PowerSGD's math

def _orthonormal(a: np.ndarray) -> np.ndarray:
    q, r = np.linalg.qr(a.astype(np.float64))
    return q * np.sign(np.diag(r))  # Gram-Schmidt's basis: R's diagonal positive


def _reference_step(grads: list[np.ndarray], errors: list[np.ndarray], q: np.ndarray) -> tuple[Any, ...]:
    """One PowerSGD step over the replicas' gradient matrices, in float64 (Vogels et al. 2019, Algorithm 1+2)."""
    ms = [g + e for g, e in zip(grads, errors)]
    p = _orthonormal(sum(m @ _orthonormal(q) for m in ms))
    q_sum = sum(m.T @ p for m in ms)
    approx = p @ q_sum.T
    return approx, [m - approx / len(ms) for m in ms], q_sum


def test_powersgd_step_matches_a_numpy_reference(keras3: Any, logical_cpus: list[str]) -> None:
    rng = np.random.default_rng(3)
    shape, rank = (4, 4, 12), 2  # a 16 x 12 matrix (192 values; (16+12)*2 = 56 sent), and a bias
    grads = [[rng.normal(size=shape).astype(np.float32) for _ in range(2)] for _ in range(2)]  # [step][replica]
    biases = [[rng.normal(size=(12,)).astype(np.float32) for _ in range(2)] for _ in range(2)]
    strategy = tfl.strategies.build("mirrored", devices=logical_cpus[:2], compression=f"powersgd:rank={rank}")
    with strategy.scope():
        kernel, bias = keras3.Variable(np.zeros(shape, np.float32)), keras3.Variable(np.zeros(12, np.float32))
        optimizer = keras3.optimizers.SGD(learning_rate=1.0)
        optimizer.build([kernel, bias])

    @tf.function
    def step(g: Any, b: Any) -> None:
        def replica() -> None:
            i = tf.distribute.get_replica_context().replica_id_in_sync_group
            optimizer.apply_gradients([(tf.gather(g, i), kernel), (tf.gather(b, i), bias)])
        strategy.run(replica)

    q = compression.initial_q(12, rank, 0).numpy().astype(np.float64)
    errors = [np.zeros((16, 12)), np.zeros((16, 12))]
    before, bias_before = np.zeros((16, 12)), np.zeros(12)
    for s in range(2):
        step(tf.constant(np.stack(grads[s])), tf.constant(np.stack(biases[s])))
        approx, errors, q = _reference_step([g.reshape(16, 12).astype(np.float64) for g in grads[s]], errors, q)
        now = kernel.numpy().reshape(16, 12)
        np.testing.assert_allclose(before - now, approx, rtol=1e-5, atol=1e-5 * np.abs(approx).max())
        np.testing.assert_allclose(bias_before - bias.numpy(), biases[s][0] + biases[s][1], rtol=1e-6, atol=1e-6)
        before, bias_before = now, bias.numpy()
    assert np.abs(errors[0]).max() > 1e-2  # the second step really carried an error forward


# ------------------------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("name", ["one_device", "central_storage", "parameter_server"])
def test_strategies_without_an_all_reduce_refuse_compression_naming_those_that_take_it(name: str) -> None:
    with pytest.raises(TypeError, match=rf"Strategy '{name}' does not take option\(s\) compression\. .* "
                                        r"compression is an option of: mirrored, multi_worker_mirrored\."):
        tfl.strategies.build(name, compression="fp16")


@pytest.mark.parametrize(("value", "message"), [
    ("zip", "compression must be one of 'none', 'fp16', 'bf16', 'powersgd' (PowerSGD's rank as 'powersgd:rank=2'). "
            "Received: compression='zip'"),
    ("powersgd:rank=0", "compression's rank must be an integer >= 1. Received: compression='powersgd:rank=0'"),
    ("powersgd:rnak=2", "compression 'powersgd' takes its options: rank, not rnak. Received: "
                        "compression='powersgd:rnak=2'"),
    ("fp16:rank=2", "compression 'fp16' takes no options, not rank. Received: compression='fp16:rank=2'"),
    (16, "compression must be one of"),
])
def test_a_bad_compression_is_one_clear_error(logical_cpus: list[str], value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tfl.strategies.build("mirrored", devices=logical_cpus[:2], compression=value)


def test_traffic_needs_the_option(logical_cpus: list[str]) -> None:
    with pytest.raises(ValueError, match="built without the compression option.*compression='none'"):
        compression.traffic(tfl.strategies.build("mirrored", devices=logical_cpus[:2]))
