"""The REST API over a real socket with plain HTTP (urllib): status, metadata, predict in row and
columnar formats, version and label pinning, and a clear 4xx for every bad request, after
which the server still answers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from .conftest import assert_float32_close


def http(server, path: str, body: object = None, *, method: str | None = None, raw: bytes | None = None):
    """(status, decoded JSON) for one request to ``server``'s REST port."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(f"http://127.0.0.1:{server.rest_api_port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_model_status_lists_every_served_version(server):
    available = {"state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    assert http(server, "/v1/models/digits") == (200, {"model_version_status": [
        {"version": "1", **available}, {"version": "2", **available}]})
    assert http(server, "/v1/models/digits/versions/2") == (200, {"model_version_status": [
        {"version": "2", **available}]})


def test_metadata_names_the_signature_inputs_and_outputs(server):
    status, body = http(server, "/v1/models/digits/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": "digits", "signature_name": "", "version": "2"}
    sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    assert sig["inputs"]["image"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in sig["inputs"]["image"]["tensor_shape"]["dim"]] == ["-1", "8", "8", "1"]
    assert list(sig["outputs"]) == ["logits"]


def test_predict_row_and_columnar_formats_return_the_models_own_outputs(server, digits_models, images):
    expected = digits_models[2].predict(images[:5], verbose=0)
    status, body = http(server, "/v1/models/digits:predict", {"instances": images[:5].tolist()})
    assert status == 200
    assert_float32_close(np.array(body["predictions"], dtype=np.float32), expected)
    status, body = http(server, "/v1/models/digits:predict",
                        {"signature_name": "serving_default", "inputs": {"image": images[:5].tolist()}})
    assert status == 200
    assert_float32_close(np.array(body["outputs"], dtype=np.float32), expected)
    status, body = http(server, "/v1/models/digits:predict", {"instances": [{"image": x} for x in images[:5].tolist()]})
    assert_float32_close(np.array(body["predictions"], dtype=np.float32), expected)


@pytest.mark.parametrize("path,version", [("/versions/1", 1), ("/labels/stable", 1), ("/labels/canary", 2), ("", 2)])
def test_a_request_can_pin_a_version_or_a_label(server, digits_models, images, path, version):
    status, body = http(server, f"/v1/models/digits{path}:predict", {"instances": images[:3].tolist()})
    assert status == 200
    assert_float32_close(np.array(body["predictions"], dtype=np.float32),
                         digits_models[version].predict(images[:3], verbose=0))


def _bad_requests(images):
    row = images[0].tolist()
    return [
        ("malformed JSON", "/v1/models/digits:predict", None, b'{"instances": [1, 2', 400, "JSON Parse error"),
        ("not an object", "/v1/models/digits:predict", [1, 2], None, 400, "must be a JSON object"),
        ("neither format", "/v1/models/digits:predict", {"rows": [row]}, None, 400, "exactly one of 'instances'"),
        ("wrong shape", "/v1/models/digits:predict", {"instances": [[1.0, 2.0]]}, None, 400,
         "Input 'image' must have shape float32[None, 8, 8, 1]. Received: float32[1, 2]"),
        ("ragged", "/v1/models/digits:predict", {"instances": [row, row[:3]]}, None, 400, "ragged"),
        ("strings", "/v1/models/digits:predict", {"inputs": [[["a"] * 1] * 8] * 8}, None, 400,
         "Input 'image' must hold float32 numbers"),
        ("no rows", "/v1/models/digits:predict", {"inputs": []}, None, 400, "shape"),
        ("unknown input", "/v1/models/digits:predict", {"inputs": {"pixels": [row]}}, None, 400,
         "missing ['image'], unknown ['pixels']"),
        ("unknown signature", "/v1/models/digits:predict", {"signature_name": "nope", "instances": [row]}, None,
         400, "Serving signature name: 'nope' not found"),
        ("unknown model", "/v1/models/mnist:predict", {"instances": [row]}, None, 404, "model 'mnist' is not served"),
        ("unknown version", "/v1/models/digits/versions/7:predict", {"instances": [row]}, None, 404,
         "Specific(digits, 7)"),
        ("unknown label", "/v1/models/digits/labels/beta:predict", {"instances": [row]}, None, 404,
         "Unrecognized servable version label: 'beta'"),
        ("bad version", "/v1/models/digits/versions/x:predict", {"instances": [row]}, None, 400,
         "must be a non-negative integer. Received: 'x'"),
        ("oversized", "/v1/models/digits:predict", None, b'{"instances": [' + b"0," * 40000 + b"0]}", 413, "too large"),
        ("unknown path", "/v2/anything", None, None, 404, "Not Found"),
        ("nested 30,000 deep", "/v1/models/digits:predict", None, b'{"instances": ' + b"[" * 30_000 + b"]" * 30_000
         + b"}", 400, "JSON Parse error: the body nests arrays or objects deeper than"),
    ]


@pytest.mark.parametrize("case", _bad_requests(np.zeros((1, 8, 8, 1), np.float32)), ids=lambda c: c[0])
def test_every_bad_request_gets_a_clear_4xx_and_the_server_stays_up(server, images, case):
    _, path, body, raw, code, message = case
    status, reply = http(server, path, body, raw=raw, method="POST")
    assert status == code
    assert list(reply) == ["error"] and message in reply["error"], reply
    assert http(server, "/v1/models/digits:predict", {"instances": images[:2].tolist()})[0] == 200


def test_a_body_nested_100000_deep_is_a_parse_error_not_a_crash():
    from tensorfleet.serving.errors import Code, ServingError
    from tensorfleet.serving.rest import decode_body

    with pytest.raises(ServingError, match="nests arrays or objects deeper than") as info:
        decode_body(b"[" * 100_000 + b"]" * 100_000)
    assert info.value.code is Code.INVALID_ARGUMENT and info.value.http_status == 400


def test_wrong_methods_get_405(server):
    assert http(server, "/v1/models/digits:predict", method="GET")[0] == 405
    assert http(server, "/v1/models/digits", {"x": 1}, method="POST")[0] == 405
