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


def _general_rows(raw: bytes, inner: tuple[int, ...]):
    """What the general path makes of ``raw`` as the one input's rows: the array, or None if it refuses."""
    from tensorfleet.serving.errors import ServingError
    from tensorfleet.serving.rest import decode_body

    try:
        body = decode_body(raw)
    except ServingError:
        return None
    if not isinstance(body, dict) or list(body) != ["instances"] or not isinstance(body["instances"], list):
        return None
    try:
        array = np.asarray(body["instances"])
    except ValueError:  # ragged
        return None
    if array.ndim != len(inner) + 1 or array.shape[1:] != inner or not len(array) or array.dtype.kind not in "iuf":
        return None
    return array


def _assert_same_rows(raw: bytes, inner: tuple[int, ...]) -> bool:
    """read_instances(raw) is None, or exactly the general path's array (dtype, values, signs of zero)."""
    from tensorfleet.serving.rest import read_instances

    fast, general = read_instances(raw, inner), _general_rows(raw, inner)
    if fast is None:
        return False
    assert general is not None, f"read {raw!r} that the general path refuses"
    assert fast.dtype == general.dtype and fast.shape == general.shape, (raw, fast, general)
    assert np.array_equal(fast, general) and np.array_equal(np.signbit(fast), np.signbit(general)), raw
    return True


def test_the_row_form_is_read_without_nested_lists_exactly_as_the_decoded_rows():
    accepted = [
        (b'{"instances": [[1.5, 2], [3, 4]]}', (2,)),
        (b' {\n "instances" :\t[ [ [0.0] , [-0.0] ] ]\r\n} ', (2, 1)),
        (b'{"instances": [1, 2, 3]}', ()),  # ints stay ints (int64), as np.asarray makes them
        (b'{"instances": [[1e3, 2E-2, -1.25e+2, 0.1]]}', (4,)),
        (b'{"instances": [[9007199254740993, 1]]}', (2,)),
        (b'{"instances": [[18446744073709551615], [-3]]}', (1,)),  # beyond int64: float64, as np.asarray does
    ]
    for raw, inner in accepted:
        assert _assert_same_rows(raw, inner), raw
    refused = [
        b'{"instances": [[1]2, [3]]}', b'{"instances": [[]3, [2]]}', b'{"instances": [[1 2], [3, 4]]}',
        b'{"instances": [[1,], [2]]}', b'{"instances": [[01], [2]]}', b'{"instances": [[+1], [2]]}',
        b'{"instances": [[.5], [2]]}', b'{"instances": [[1.], [2]]}', b'{"instances": [[1], [2, 3]]}',
        b'{"instances": [[], [2]]}', b'{"instances": []}', b'{"instances": [[1e400], [2]]}',
        b'{"instances": [[1], [2]], "signature_name": "serving_default"}', b'{"\\u0069nstances": [[1], [2]]}',
        b'{"instances": [[true], [2]]}', b'{"instances": [["1"], [2]]}', b'{"instances": [[1], [2]]',
    ]
    from tensorfleet.serving.rest import read_instances

    for raw in refused:
        assert read_instances(raw, (1,)) is None, raw


def test_no_body_is_read_otherwise_than_the_general_path_reads_it():
    """Seeded mutations of row-form bodies (bytes changed, dropped, added): whatever read_instances
    accepts, the general path reads to the same array; every well-formed body is accepted."""
    import random

    rng = random.Random(0)
    numbers = ["0", "-0", "7", "-3", "0.5", "1e3", "2E-2", "-0.0", "1.25e+2", "9007199254740993", "3.4028235e38"]

    def nest(shape: tuple[int, ...]) -> str:
        if not shape:
            return rng.choice(numbers)
        return "[" + rng.choice([",", ", ", " ,"]).join(nest(shape[1:]) for _ in range(shape[0])) + "]"

    accepted = 0
    for _ in range(3000):
        inner = rng.choice([(), (1,), (2,), (2, 1), (1, 3), (2, 2, 1)])
        raw = ('{"instances":' + rng.choice(["", " ", "\n"]) + nest((rng.randint(1, 3), *inner)) + "}").encode()
        if rng.random() < 0.3:
            assert _assert_same_rows(raw, inner), raw  # a well-formed body is read
            continue
        mutated = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            at, byte, change = rng.randrange(len(mutated)), rng.choice(b"0123456789.eE+-[], \t\n"), rng.randrange(3)
            if change == 0:
                mutated[at] = byte
            elif change == 1:
                del mutated[at]
            else:
                mutated.insert(at, byte)
        accepted += _assert_same_rows(bytes(mutated), inner)
    assert accepted > 100  # the mutations left many bodies well formed: both paths were compared on them


def test_a_row_form_body_is_answered_byte_for_byte_as_through_the_general_path(server, images):
    def raw_reply(body: bytes) -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://127.0.0.1:{server.rest_api_port}/v1/models/digits:predict",
                                         data=body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()

    rows = json.dumps(images[:3].tolist())
    fast = raw_reply(f'{{"instances": {rows}}}'.encode())
    general = raw_reply(f'{{"instances": {rows}, "signature_name": "serving_default"}}'.encode())
    assert fast[0] == general[0] == 200 and fast[1] == general[1]


def test_replies_spell_numbers_as_tf_serving_does():
    from tensorfleet.serving.rest import encode_reply

    assert encode_reply({"y": np.array([[0.1, 2.0]], np.float32)}, rows=True) == b'{"predictions":[[0.1,2.0]]}'
    assert (encode_reply({"y": np.array([[np.nan, np.inf, -np.inf, 0.5]], np.float32)}, rows=True)
            == b'{"predictions":[[NaN,Infinity,-Infinity,0.5]]}')
    assert encode_reply({"a": np.array([1, 2]), "b": np.array([0.25, 3.0], np.float32)}, rows=True) == (
        b'{"predictions":[{"a":1,"b":0.25},{"a":2,"b":3.0}]}')
    # an output named "null" is not taken for a NaN: its floats keep their float32 spelling
    assert encode_reply({"null": np.array([0.1], np.float32)}, rows=False) == b'{"outputs":[0.1]}'
    assert (encode_reply({"null": np.array([0.1], np.float32), "z": np.array([1])}, rows=False)
            == b'{"outputs":{"null":[0.1],"z":[1]}}')
