"""Memory estimates against Keras's own counts and real tensors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tensorfleet.compat.keras import keras2
from tensorfleet.models import build
from tensorfleet.planner import memory as M

tf_keras = keras2()  # the tests' Keras 2: tf_keras (tf.keras on the tff track's TensorFlow 2.14)


def _branchy_model() -> tf_keras.Model:
    inputs = tf_keras.Input(shape=(6, 6, 3))
    a = tf_keras.layers.Conv2D(4, 3, padding="same")(inputs)
    a = tf_keras.layers.BatchNormalization()(a)
    b = tf_keras.layers.Conv2D(2, 1)(inputs)
    x = tf_keras.layers.Concatenate()([a, b])
    x = tf_keras.layers.GlobalAveragePooling2D()(x)
    outputs = tf_keras.layers.Dense(5)(x)
    return tf_keras.Model(inputs, outputs, name="branchy")


MODELS = {"digits_cnn": lambda: build("digits_cnn", keras="tf_keras"),
          "digits_mlp": lambda: build("digits_mlp", keras="tf_keras"), "branchy": _branchy_model}


@pytest.mark.parametrize("name", list(MODELS))
def test_parameter_counts_equal_keras_count_params(name):
    model = MODELS[name]()
    table = M.layer_table(model)
    assert sum(row.parameters for row in table) == model.count_params()
    assert sum(row.trainable for row in table) == sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert M.estimate(model, batch_size=8, optimizer="sgd").parameters == 4 * model.count_params()


@pytest.mark.parametrize("name", list(MODELS))
def test_activation_estimate_equals_the_tensors_a_forward_pass_produces(name):
    model = MODELS[name]()
    probe = tf_keras.Model(model.inputs, [layer.output for layer in model.layers])
    batch = 7
    x = np.random.default_rng(0).random((batch, *model.input_shape[1:]), dtype=np.float32)
    produced = sum(int(tf.size(t)) for t in probe(x, training=True))
    assert M.activation_values(model) * batch == produced
    assert M.estimate(model, batch_size=batch).activations == produced * 4


def test_digits_cnn_figures_exactly():
    model = build("digits_cnn", keras="tf_keras")
    assert [row.activation_values for row in M.layer_table(model)] == [64, 1024, 2048, 512, 512, 64, 10]
    est = M.estimate(model, batch_size=64, optimizer="adam")
    assert (est.parameters, est.gradients, est.optimizer_state) == (38282 * 4, 38282 * 4, 38282 * 8)
    assert est.activations == 4234 * 64 * 4


def test_optimizer_state_matches_the_variables_keras_optimizers_create():
    model = build("digits_mlp", keras="tf_keras")
    n = model.count_params()
    # Keras 2.14's SGD keeps a momentum slot per weight even at momentum=0, so an SGD instance
    # is counted as what it allocates; the name "sgd" stands for plain SGD with no state.
    for optimizer, states in ((tf_keras.optimizers.SGD(0.1), 1), (tf_keras.optimizers.SGD(0.1, momentum=0.9), 1),
                              (tf_keras.optimizers.Adam(), 2)):
        optimizer.build(model.trainable_variables)
        created = sum(int(np.prod(v.shape)) for v in optimizer.variables if v.shape.rank)
        assert created == states * n
        assert M.estimate(model, batch_size=4, optimizer=optimizer).optimizer_state == 4 * created


def test_bytes_per_parameter_table_and_the_16_byte_rule():
    assert M.bytes_per_parameter("sgd") == {"parameters": 4, "gradients": 4, "optimizer_state": 0}
    assert M.bytes_per_parameter("momentum") == {"parameters": 4, "gradients": 4, "optimizer_state": 4}
    assert M.bytes_per_parameter("adam") == {"parameters": 4, "gradients": 4, "optimizer_state": 8}
    assert sum(M.bytes_per_parameter("adam", "mixed_float16").values()) == 16
    assert sum(M.bytes_per_parameter("sgd", "mixed_bfloat16").values()) == 8


def test_data_tensor_pipeline_and_hybrid_divide_memory_as_documented():
    params, acts, batch = [1000.0, 3000.0, 2000.0, 2000.0], [10.0, 20.0, 30.0, 40.0], 32
    one = M.estimate_from_counts(stage_parameters=[sum(params)], stage_activation_values=[sum(acts)],
                                 batch_size=batch, optimizer="adam")
    assert one.total == 8000 * 16 + 100 * 32 * 4
    data = M.estimate_from_counts(stage_parameters=[sum(params)], stage_activation_values=[sum(acts)],
                                  batch_size=batch, parallelism="data", devices=4)
    assert data.model_states == one.model_states and data.activations == one.activations / 4
    tensor = M.estimate_from_counts(stage_parameters=[sum(params)], stage_activation_values=[sum(acts)],
                                    batch_size=batch, parallelism="tensor", devices=4)
    assert tensor.total == one.total / 4
    # Pipeline over 4 stages, 8 micro-batches of 4: 1F1B keeps 4 - stage in flight, GPipe all 8.
    pipe = M.estimate_from_counts(stage_parameters=params, stage_activation_values=acts, batch_size=batch,
                                  parallelism="pipeline", devices=4, micro_batches=8)
    stage_totals = [p * 16 + a * 4 * min(4 - s, 8) * 4 for s, (p, a) in enumerate(zip(params, acts))]
    assert pipe.total == max(stage_totals) and pipe.micro_batch == 4
    gpipe = M.estimate_from_counts(stage_parameters=params, stage_activation_values=acts, batch_size=batch,
                                   parallelism="pipeline", devices=4, micro_batches=8, schedule="gpipe")
    assert gpipe.total == max(p * 16 + a * 4 * 8 * 4 for p, a in zip(params, acts))
    hybrid = M.estimate_from_counts(stage_parameters=[4000.0, 4000.0], stage_activation_values=[30.0, 70.0],
                                    batch_size=batch, parallelism="hybrid", devices=8, tensor=2, micro_batches=2)
    # data 2 x tensor 2 x pipeline 2: 16 examples per replica, micro-batches of 8.
    assert hybrid.total == (4000 * 16 + 70 * 8 * 1 * 4) / 2 and hybrid.micro_batch == 8


def test_model_pipeline_stages_are_balanced_by_parameters():
    assert M.split_stages([1, 1, 1, 5, 1, 1], 3) == [[0, 1, 2], [3], [4, 5]]
    assert M.split_stages([4, 4, 4, 4], 2) == [[0, 1], [2, 3]]
    model = build("digits_cnn", keras="tf_keras")
    est = M.estimate(model, batch_size=32, parallelism="pipeline", devices=2, micro_batches=4)
    # Stage 0 = input..flatten (4,800 params, 4,160 activation values per example, 2 micro-batches
    # of 8 in flight): 343,040 bytes. Stage 1 = the dense layers (33,482 params, 74 values, 1 in
    # flight): 538,080 bytes, the fuller device.
    assert (est.parameters, est.activations, est.total) == (33482 * 4, 74 * 8 * 4, 538080)


def test_per_layer_plot_is_a_png(tmp_path):
    path = M.plot_layers(build("digits_cnn", keras="tf_keras"), tmp_path / "layers.png", batch_size=64)
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_bad_inputs_are_rejected_at_the_boundary():
    model = build("digits_mlp", keras="tf_keras")
    with pytest.raises(ValueError,
                       match="optimizer must be one of 'sgd', 'momentum', 'adam'. Received: optimizer='adagrad'"):
        M.estimate(model, batch_size=8, optimizer="adagrad")
    with pytest.raises(ValueError, match="precision must be one of 'float32', 'mixed_float16', 'mixed_bfloat16'. "
                                         "Received: precision='fp8'"):
        M.estimate(model, batch_size=8, precision="fp8")
    with pytest.raises(ValueError, match="batch_size must be a positive integer. Received: batch_size=0"):
        M.estimate(model, batch_size=0)
    with pytest.raises(ValueError,
                       match="batch_size must be divisible by the data-parallel degree 4. Received: batch_size=6"):
        M.estimate(model, batch_size=6, devices=4)
    with pytest.raises(ValueError, match="devices divisible by tensor x pipeline. Received: devices=6, tensor=4"):
        M.estimate_from_counts(stage_parameters=[1.0], stage_activation_values=[1.0], batch_size=8,
                               parallelism="hybrid", devices=6, tensor=4)
    with pytest.raises(TypeError, match=r"^the planner's memory model takes a Keras model \(Keras 3 or tf_keras\)\. "
                                        r"Received: model of type str$"):
        M.layer_table("digits_mlp")
    with pytest.raises(ValueError,
                       match=r"num_stages must be at most the number of layers \(3\).*Received: num_stages=4"):
        M.estimate(model, batch_size=8, parallelism="pipeline", devices=4)


def test_zero_stages_shard_model_states_over_the_data_parallel_replicas_exactly():
    # 1.5B parameters on 64 replicas (Rajbhandari et al.): mixed-precision Adam 16, 4 + 12/N, 2 + 14/N, 16/N.
    def states(zero, precision):
        est = M.estimate_from_counts(stage_parameters=[1.5e9], stage_activation_values=[0.0], batch_size=64,
                                     precision=precision, parallelism="data", devices=64, zero=zero)
        return est.parameters, est.gradients, est.optimizer_state
    assert [sum(states(z, "mixed_float16")) for z in range(4)] == [24e9, 6.28125e9, 3.328125e9, 0.375e9]
    assert states(1, "mixed_float16") == (3e9, 3e9, 0.28125e9)
    # float32 Adam, as memory.py counts it: 4 weights + 4 gradients + 8 for m and v.
    assert states(0, "float32") == (6e9, 6e9, 12e9)
    assert states(1, "float32") == (6e9, 6e9, 12e9 / 64)
    assert states(2, "float32") == (6e9, 6e9 / 64, 12e9 / 64)
    assert states(3, "float32") == (6e9 / 64, 6e9 / 64, 12e9 / 64)
    assert M.zero_bytes_per_parameter("adam", "mixed_bfloat16", zero=2, replicas=4) == {
        "parameters": 2.0, "gradients": 0.5, "optimizer_state": 3.0}
    # Only the data-parallel degree shards: hybrid d=2 x t=4 divides by 4 (tensor), then by 2.
    hybrid = M.estimate_from_counts(stage_parameters=[8000.0], stage_activation_values=[0.0], batch_size=8,
                                    parallelism="hybrid", devices=8, tensor=4, zero=3)
    assert hybrid.model_states == 8000 * 16 / 8
    tensor = M.estimate_from_counts(stage_parameters=[8000.0], stage_activation_values=[0.0], batch_size=8,
                                    parallelism="tensor", devices=8, zero=3)
    assert tensor.model_states == 8000 * 16 / 8  # one replica: ZeRO changes nothing


def test_zero_stage_out_of_range_is_refused():
    for bad in (-1, 4, 1.0, True):
        with pytest.raises(ValueError, match=rf"zero must be an integer from 0 to 3. Received: zero={bad!r}$"):
            M.estimate_from_counts(stage_parameters=[1.0], stage_activation_values=[1.0], batch_size=8, zero=bad)


def test_zero_1_optimizer_bytes_equal_what_the_mesh_holds_for_the_bench_gpt():
    """bench/mesh_memory.py's small GPT on b:4 with Mesh(..., zero=1), measured from the variables."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "mesh_memory.py"
    spec = importlib.util.spec_from_file_location("mesh_memory_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    measured = bench.measure("b:4", "batch:b", 1)
    assert measured["params"] == 29568
    est = M.estimate(bench.small_gpt(), batch_size=4, optimizer="adam", parallelism="data", devices=4, zero=1)
    assert est.optimizer_state == 8 * 29568 / 4 == 59136
    assert est.parameters == 4 * 29568 and set(measured["parameter_bytes"].values()) == {4 * 29568}
    # The mesh also holds Adam's int64 step counter (8 bytes, replicated), which the planner does not count.
    assert set(measured["optimizer_bytes"].values()) == {59144}
    assert abs(59144 / est.optimizer_state - 1) < 1e-3
