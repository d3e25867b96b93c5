"""Keras 3 models served: ``export`` writes the signature a tf_keras model gets (names, dtypes, a batch
dimension of any size), the server answers what ``model.predict`` does over REST and gRPC, with warm-up
and stages; a ``.keras`` file a user saved with Keras 3 exports through the CLI and serves."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tensorfleet.cli.main import main
from tensorfleet.serving.options import StageOptions
from tests.conftest import user_env

from .conftest import assert_float32_close, start_server


@pytest.fixture(scope="module")
def keras3_digits(keras3: Any) -> Any:
    """The digits CNN built in Keras 3."""
    from tensorfleet.models import build

    model = build("digits_cnn", keras="keras3", seed=3)
    assert type(model).__module__.startswith("keras.")
    return model


def _signature(path: Path) -> Any:
    import tensorflow as tf

    return tf.saved_model.load(str(path)).signatures["serving_default"]


def _rest(server: Any, rows: np.ndarray, name: str = "digits") -> np.ndarray:
    body = json.dumps({"instances": rows.tolist()}).encode()
    url = f"http://127.0.0.1:{server.rest_api_port}/v1/models/{name}:predict"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as reply:
        return np.array(json.loads(reply.read())["predictions"], np.float32)


def _grpc(server: Any, rows: np.ndarray, name: str = "digits") -> np.ndarray:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(rows))
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return tf.make_ndarray(response.outputs["logits"])


def test_a_keras3_model_exports_the_signature_a_tf_keras_model_gets(tmp_path, keras3_digits, digits_models, images):
    import tensorflow as tf

    from tensorfleet.serving import export

    keras3_result = export(keras3_digits, tmp_path / "k3", version=1)
    keras2_result = export(digits_models[1], tmp_path / "k2", version=1)
    assert [str(t) for t in keras3_result.inputs] == ["image: float32[None, 8, 8, 1]"]
    assert [str(t) for t in keras3_result.outputs] == ["logits: float32[None, 10]"]
    assert (keras3_result.inputs, keras3_result.outputs) == (keras2_result.inputs, keras2_result.outputs)
    assert sorted(p.name for p in (tmp_path / "k3").iterdir()) == ["1"]  # no temporary directory left
    signatures = [_signature(r.path) for r in (keras3_result, keras2_result)]
    assert signatures[0].structured_input_signature == signatures[1].structured_input_signature
    assert signatures[0].structured_outputs == signatures[1].structured_outputs
    out = signatures[0](image=tf.constant(images))["logits"].numpy()
    assert_float32_close(out, keras3_digits.predict(images, verbose=0))
    with pytest.raises(ValueError, match=r"output_names must name each of the model's 1 tensors"):
        export(keras3_digits, tmp_path / "k3", version=2, output_names=["a", "b"])
    with pytest.raises(TypeError, match=r"^tfl\.serving\.export takes a Keras model \(Keras 3 or tf_keras\)\. "
                                        r"Received: model of type object$"):
        export(object(), tmp_path / "k3", version=3)
    assert sorted(p.name for p in (tmp_path / "k3").iterdir()) == ["1"]


def test_a_keras3_sequential_is_named_after_its_layers(tmp_path, keras3):
    from tensorfleet.serving import export

    model = keras3.Sequential([keras3.Input((4,), name="features"), keras3.layers.Dense(2, name="scores")])
    result = export(model, tmp_path, version=1)
    assert [str(t) for t in result.inputs + result.outputs] == ["features: float32[None, 4]",
                                                                "scores: float32[None, 2]"]
    with pytest.raises(ValueError, match=r"export needs a built Keras model with known inputs .* Received: "
                                         r"Sequential$"):
        export(keras3.Sequential([keras3.layers.Dense(2)]), tmp_path, version=2)


def test_a_keras3_model_is_served_over_rest_and_grpc_with_warmup_and_stages(
        tmp_path, keras3_digits, images):
    from tensorfleet.serving import export

    result = export(keras3_digits, tmp_path / "digits", version=1, stages=2, warmup=images[:3])
    assert result.stages == ("stage_0", "stage_1")
    expected = keras3_digits.predict(images, verbose=0)
    server = start_server(tmp_path / "digits")
    try:
        assert server.repository.get("digits").warmup_records == 3
        assert_float32_close(_rest(server, images[:9]), expected[:9])
        assert_float32_close(_grpc(server, images[:9]), expected[:9])
    finally:
        server.stop()
    server = start_server(tmp_path / "digits", stages=StageOptions(2, micro_batches=3))
    try:
        assert_float32_close(_rest(server, images[:17]), expected[:17])
        assert_float32_close(_grpc(server, images), expected)
    finally:
        server.stop()


def test_a_keras3_sequential_loaded_from_a_keras_file_is_served_in_stages(tmp_path, keras3):
    # Loading builds a Sequential twice: its first layer's `output` is not the tensor the next layer reads.
    from tensorfleet.serving import export

    saved = keras3.Sequential([keras3.Input((12,)), keras3.layers.Dense(16, activation="relu", name="hidden"),
                               keras3.layers.Dense(3, name="scores")])
    saved.save(tmp_path / "chain.keras")
    model = keras3.models.load_model(tmp_path / "chain.keras")
    assert export(model, tmp_path / "chain", version=1, stages=2).stages == ("stage_0", "stage_1")
    x = np.random.default_rng(0).normal(size=(7, 12)).astype(np.float32)
    server = start_server(tmp_path / "chain", stages=StageOptions(2, micro_batches=2))
    try:
        assert_float32_close(_rest(server, x), model.predict(x, verbose=0))
    finally:
        server.stop()
    twice = keras3.layers.Dense(12, name="twice")
    with pytest.raises(ValueError, match=r"layer 'twice' of model '.*' does not\. .* Received: layer 'twice' of "
                                         r"type Dense, which is used more than once"):
        export(keras3.Sequential([keras3.Input((12,)), twice, twice]), tmp_path / "twice", version=1, stages=2)


def test_a_keras3_model_that_is_not_a_chain_cannot_be_staged_and_says_why(tmp_path, keras3):
    from tensorfleet.serving import export

    x = keras3.Input((4,), name="x")
    hidden = keras3.layers.Dense(4, name="hidden")(x)
    model = keras3.Model(x, keras3.layers.Dense(1, name="out")(keras3.layers.Add(name="skip")([x, hidden])))
    with pytest.raises(ValueError, match=r"^Serving a model in stages needs a model whose layers form one chain "
                                         r"\(each layer feeding the next\); layer 'skip' of model '.*' does not\. "
                                         r"Wrap branching parts in one layer\. Received: layer 'skip' of type Add, "
                                         r"which does not take the output of 'hidden' as its only input"):
        export(model, tmp_path / "skip", version=1, stages=2)
    assert not (tmp_path / "skip" / "1").exists()


USER_SCRIPT = textwrap.dedent("""
    import sys

    import keras
    import numpy as np

    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((8, 8, 1), name="image"), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Flatten(),
                              keras.layers.Dense(10, name="logits")])
    model.save(sys.argv[1])
    np.save(sys.argv[3], model.predict(np.load(sys.argv[2]), verbose=0))
    print(keras.__version__)
""")


@pytest.mark.slow
def test_a_keras3_file_a_user_saved_exports_through_the_cli_and_serves(tmp_path, images, capsys, keras3):
    saved, rows, predictions = tmp_path / "user.keras", tmp_path / "rows.npy", tmp_path / "predictions.npy"
    np.save(rows, images[:11])
    child = subprocess.run([sys.executable, "-c", USER_SCRIPT, str(saved), str(rows), str(predictions)],
                           env=user_env(), capture_output=True, text=True, timeout=300, check=False)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == keras3.__version__  # the user's `import keras` was Keras 3
    assert main(["serving", "export", str(saved), str(tmp_path / "digits"), "--version", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"exported version 2 to {tmp_path / 'digits' / '2'} (signature 'serving_default')",
        "  input  image: float32[None, 8, 8, 1]",
        "  output logits: float32[None, 10]",
    ]
    server = start_server(tmp_path / "digits")
    try:
        expected = np.load(predictions)
        assert_float32_close(_rest(server, images[:11]), expected)
        assert_float32_close(_grpc(server, images[:11]), expected)
    finally:
        server.stop()


def test_a_damaged_keras_file_is_one_clear_error_and_exit_2(tmp_path, capsys):
    damaged = tmp_path / "damaged.keras"
    damaged.write_bytes(b"this is not a model")
    assert main(["serving", "export", str(damaged), str(tmp_path / "digits")]) == 2
    assert capsys.readouterr().err == (f"error: {damaged} is neither a .keras archive (zip) nor an .h5 model (HDF5): "
                                       "its first bytes are b'this is '\n")
    assert not (tmp_path / "digits").exists()


def test_a_keras3_archive_that_does_not_load_is_one_clear_error_and_exit_2(tmp_path, capsys, keras3):
    import zipfile

    damaged = tmp_path / "damaged.keras"
    with zipfile.ZipFile(damaged, "w") as archive:
        archive.writestr("metadata.json", '{"keras_version": "3.15.1"}')
    assert main(["serving", "export", str(damaged), str(tmp_path / "digits")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: tfl.serving.load_keras_model: {damaged} (saved by keras3) could not be loaded by "
                          "keras 3.") and err.count("\n") == 1, err
    assert not (tmp_path / "digits").exists()
