"""What of model parallelism still takes tf_keras models only gives a Keras 3 model (the ``keras`` package,
installed beside tf_keras on the current track) one clear error naming the entry point and the fix: the chain
shorthands (``Mesh.fit``, ``Mesh.keras_model``), the ``mtf`` and ``keras``
backends and tensor-parallel layers. ``Mesh.scope()`` with the dtensor backend trains a Keras 3 model
(tests/model_parallel/test_mesh_keras3.py), and so do pipelines (test_pipeline_keras3.py)."""

from __future__ import annotations

import pytest

from tensorfleet.compat.keras import Keras3ModelError

_FIX = r".* For Keras 2, build the model with `import tf_keras as keras`"


def test_mesh_refuses_a_keras3_model_at_fit_check_and_keras_model(keras3_model):
    import numpy as np

    from tensorfleet.model_parallel.mesh import Mesh

    mesh = Mesh("b:2", "batch:b", backend="keras")
    x, y = np.zeros((8, 4), np.float32), np.zeros(8, np.int64)
    with pytest.raises(Keras3ModelError, match=r"^Mesh runs Keras 2 \(tf_keras\) models only for now, and received a "
                                               r"Keras 3 model \(keras\.src\.models\.sequential\.Sequential\)\."
                                               + _FIX):
        mesh.fit(keras3_model, x, y, batch_size=4, verbose=False)
    with pytest.raises(Keras3ModelError,
                       match=r"^Mesh runs Keras 2 \(tf_keras\) models only for now, and received a Keras 3 model"):
        mesh.check(keras3_model, 4)
    with pytest.raises(Keras3ModelError, match=r"^Mesh\.keras_model runs Keras 2 \(tf_keras\) models only for now, and "
                                               r"received a Keras 3 model" + _FIX):
        mesh.keras_model(keras3_model)


def test_tensor_parallel_copies_refuse_keras3_layers(keras3, keras3_model):
    from tensorfleet.model_parallel import tensor_parallel as tp

    devices = ["/CPU:0", "/CPU:1"]
    dense = keras3_model.layers[-1]
    with pytest.raises(Keras3ModelError, match=r"^ColumnParallelDense\.from_dense runs Keras 2 \(tf_keras\) layers "
                                               r"only for now, and received a Keras 3 layer "
                                               r"\(keras\.src\.layers\.core\.dense\.Dense\)\." + _FIX):
        tp.ColumnParallelDense.from_dense(dense, devices=devices)
    with pytest.raises(Keras3ModelError, match=r"^RowParallelDense\.from_dense runs Keras 2 \(tf_keras\) layers only "
                                               r"for now, and received a Keras 3 layer"):
        tp.RowParallelDense.from_dense(dense, devices=devices)
    with pytest.raises(Keras3ModelError, match=r"^ParallelMLP\.from_dense runs Keras 2 \(tf_keras\) layers only for "
                                               r"now, and received a Keras 3 layer"):
        tp.ParallelMLP.from_dense(dense, dense, devices=devices)
    attention = keras3.layers.MultiHeadAttention(2, 4)
    with pytest.raises(Keras3ModelError, match=r"^ParallelSelfAttention\.from_keras runs Keras 2 \(tf_keras\) layers "
                                               r"only for now, and received a Keras 3 layer"):
        tp.ParallelSelfAttention.from_keras(attention, devices=devices)


def test_what_is_no_keras_layer_is_named():
    from tensorfleet.model_parallel import tensor_parallel as tp

    with pytest.raises(TypeError, match=r"^ColumnParallelDense\.from_dense takes a Keras layer \(Keras 3 or "
                                        r"tf_keras\)\. Received: layer of type str$"):
        tp.ColumnParallelDense.from_dense("dense", devices=["/CPU:0", "/CPU:1"])


@pytest.mark.parametrize("backend", ["keras", "mtf"])
def test_a_keras3_model_compiled_inside_mesh_scope_is_refused_at_compile(keras3, keras3_model, backend):
    from tensorfleet.model_parallel.mesh import Mesh

    mesh = Mesh("b:2", "batch:b", backend=backend)
    keras_compile = keras3.Model.compile
    with mesh.scope():
        built_inside = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)])
        for model in (keras3_model, built_inside):
            with pytest.raises(Keras3ModelError, match=r"^model\.compile inside Mesh\.scope\(\) runs Keras 2 "
                                                       r"\(tf_keras\) models only for now, and received a Keras 3 "
                                                       r"model \(keras\.src\.models\.sequential\.Sequential\)\."
                                                       + _FIX):
                model.compile(optimizer="sgd", loss="mse")
            assert not model.compiled  # refused before Keras compiled anything
    assert keras3.Model.compile is keras_compile  # the scope leaves Keras 3 as it found it
    built_inside.compile(optimizer="sgd", loss="mse")  # outside the scope Keras 3 is not ours to refuse
    assert built_inside.compiled
