"""TF Serving's REST API, on the server of :mod:`tensorfleet.serving.http` (asyncio, uvloop and httptools).

``GET /v1/models/{name}[/versions/{v}]`` (version status), ``GET .../metadata`` (signatures) and
``POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict`` with the row (``instances``) or
columnar (``inputs``) format, answered with ``predictions`` or ``outputs``; metrics at TF Serving's
``/monitoring/prometheus/metrics``, liveness at ``/healthz`` and readiness at ``/readyz``. Every refusal is
``{"error": "..."}`` with TF Serving's HTTP status (400 bad input, 404 unknown model or version,
413 body over the limit, 405 wrong method).

The body's JSON is parsed on the event loop (orjson); the model runs on the batcher's threads or
the predictor's pool, so slow predictions never stop the server from reading other requests, and
the replies of a batch come back to the loop with one wake-up.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import sys
import threading
from typing import Any, Callable

import numpy as np

from tensorfleet.serving.errors import ServingError, as_serving_error
from tensorfleet.serving.http import HttpServer, Pending, Reply
from tensorfleet.serving.router import Front
from tensorfleet.serving.servable import Servable, Signature

__all__ = ["ROUTES", "RestApi", "RestServer", "decode_body", "encode_reply", "parse_predict_body", "predict_reply",
           "read_instances", "status_reply"]

_orjson: Any
try:  # JSON in and out of :predict several times faster than the json module (an optional speed-up)
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is in the lock file
    _orjson = None

_MODELS = "/v1/models/"
MAX_DIMS = 64  # numpy's limit on an array's dimensions
# Every path served: TF Serving's model API (a model name and more follow), then the fixed pages.
ROUTES = (_MODELS, "/monitoring/prometheus/metrics", "/healthz", "/readyz")
_PATH = re.compile(r"^(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
                   r"(?:(?P<meta>/metadata)|:(?P<verb>[A-Za-z]+))?$")


def parse_predict_body(body: Any, signature: Signature) -> tuple[dict[str, Any], bool]:
    """The request's inputs by name, and whether it used the row format (``instances``).

    Example:
        >>> sig = type("S", (), {"inputs": {"x": None}})()
        >>> parse_predict_body({"instances": [[1, 2], [3, 4]]}, sig)
        ({'x': [[1, 2], [3, 4]]}, True)
        >>> parse_predict_body({"inputs": {"x": [[1, 2]]}}, sig)
        ({'x': [[1, 2]]}, False)
    """
    if not isinstance(body, dict):
        raise ServingError(f"The request body must be a JSON object. Received: {type(body).__name__}")
    if ("instances" in body) == ("inputs" in body):
        raise ServingError("The request body must have exactly one of 'instances' (row format) or 'inputs' "
                           f"(columnar format). Received keys: {sorted(body)}")
    names = list(signature.inputs)
    if "instances" in body:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise ServingError("'instances' must be a non-empty list of rows.")
        if all(isinstance(row, dict) for row in instances):
            missing = sorted({n for row in instances for n in names if n not in row})
            if missing:
                raise ServingError(f"Every instance must name each input {names}; missing {missing}.")
            return {n: [row[n] for row in instances] for n in names}, True
        if len(names) == 1 and not any(isinstance(row, dict) for row in instances):
            return {names[0]: instances}, True
        raise ServingError(f"With several inputs {names}, each instance must be an object keyed by input name.")
    inputs = body["inputs"]
    if isinstance(inputs, dict):
        return inputs, False
    if len(names) == 1:
        return {names[0]: inputs}, False
    raise ServingError(f"With several inputs {names}, 'inputs' must be an object keyed by input name.")


def predict_reply(outputs: dict[str, np.ndarray], rows: bool) -> dict[str, Any]:
    """TF Serving's reply: ``predictions`` (one entry per row) or ``outputs`` (one entry per output).

    Example:
        >>> predict_reply({"y": np.array([[1.5], [2.0]])}, rows=True)
        {'predictions': [[1.5], [2.0]]}
        >>> predict_reply({"a": np.array([1, 2]), "b": np.array([3, 4])}, rows=False)
        {'outputs': {'a': [1, 2], 'b': [3, 4]}}
    """
    if rows:
        if len(outputs) == 1:
            return {"predictions": next(iter(outputs.values())).tolist()}
        lists = {k: v.tolist() for k, v in outputs.items()}
        count = len(next(iter(lists.values())))
        return {"predictions": [{k: v[i] for k, v in lists.items()} for i in range(count)]}
    if len(outputs) == 1:
        return {"outputs": next(iter(outputs.values())).tolist()}
    return {"outputs": {k: v.tolist() for k, v in outputs.items()}}


def encode_reply(outputs: dict[str, np.ndarray], rows: bool) -> bytes:
    """:func:`predict_reply` as JSON bytes. Numbers go straight from the arrays through orjson
    when it is installed (a float32 as its shortest float32 text, as TF Serving writes it); NaN and
    infinities, strings and the no-orjson case go through :mod:`json`, which spells NaN as TF Serving does.

    Example:
        >>> encode_reply({"y": np.array([[0.1], [2.0]], np.float32)}, rows=True)
        b'{"predictions":[[0.1],[2.0]]}'
    """
    if _orjson is not None and all(v.dtype.kind in "biuf" for v in outputs.values()):
        if len(outputs) == 1:
            tree: Any = next(iter(outputs.values()))
        elif rows:
            count = len(next(iter(outputs.values())))
            tree = [{k: v[i] for k, v in outputs.items()} for i in range(count)]
        else:
            tree = outputs
        text = _orjson.dumps({"predictions" if rows else "outputs": tree}, option=_orjson.OPT_SERIALIZE_NUMPY)
        # orjson writes NaN and infinities as null: only then (or for an output named so) look closer
        if b"null" not in text or all(v.dtype.kind in "biu" or np.isfinite(v).all() for v in outputs.values()):
            return text
    return json.dumps(predict_reply(outputs, rows), separators=(",", ":")).encode()


# The common :predict body, {"instances": [...]} of numbers only, and its array's bytes with every
# number character made "0" and the whitespace taken out (what the checks of read_instances look at).
_INSTANCES = re.compile(rb"[ \t\n\r]*\{[ \t\n\r]*\"instances\"[ \t\n\r]*:[ \t\n\r]*(\[[0-9.eE+\-\[\], \t\n\r]*\])"
                        rb"[ \t\n\r]*\}[ \t\n\r]*")
_ZEROS = bytes.maketrans(b"123456789.eE+-", b"0" * 14)


@functools.lru_cache(maxsize=32)
def _row_skeleton(inner: tuple[int, ...]) -> bytes:
    """A row of shape ``inner`` as JSON with its numbers left out: ``(2, 1)`` -> ``[[],[]]``."""
    text = b""
    for size in reversed(inner):
        text = b"[" + b",".join([text] * size) + b"]"
    return text


def read_instances(raw: bytes, inner: tuple[int, ...]) -> np.ndarray | None:
    """The body ``{"instances": [row, ...]}``, each row a nest of numbers of shape ``inner`` (every
    size known and positive), as one array of shape ``(rows, *inner)``, read without building the
    nested lists; None for any other body, which :func:`decode_body` and :func:`parse_predict_body`
    read (with their errors). The array equals ``np.asarray`` of the decoded rows, dtype included.

    The body's bytes are checked to be exactly that JSON: only brackets, commas, number characters
    and whitespace; the brackets and commas those of ``rows`` rows of shape ``inner``; no number
    beside a bracket's outer side; the numbers, with the brackets taken out, a JSON array (orjson)
    of one number per place.

    Example:
        >>> read_instances(b'{"instances": [[1.5, 2], [3, 4]]}', (2,)).tolist()
        [[1.5, 2.0], [3.0, 4.0]]
        >>> read_instances(b'{"instances": [[1, 2], [3]]}', (2,)) is None
        True
    """
    if _orjson is None:
        return None
    match = _INSTANCES.fullmatch(raw)
    if match is None:
        return None
    array = match.group(1)
    zeros = array.translate(_ZEROS, b" \t\n\r")
    if b"]0" in zeros or b"0[" in zeros:  # a number outside the brackets of its place
        return None
    skeleton = zeros.translate(None, b"0")
    places = skeleton.count(b",") + 1
    rows, extra = divmod(places, math.prod(inner))
    if extra or not rows or skeleton != b"[" + b",".join([_row_skeleton(inner)] * rows) + b"]":
        return None
    try:
        numbers = _orjson.loads(b"[" + array.translate(None, b"[]") + b"]")
    except ValueError:
        return None
    if len(numbers) != places:
        return None
    return np.array(numbers).reshape(rows, *inner)


def decode_body(raw: bytes) -> Any:
    """The request's JSON. orjson when installed; :mod:`json` for what orjson refuses but JSON as
    TF Serving reads it allows (NaN, Infinity, integers beyond 64 bits), and for the error's text."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except ValueError:
            pass
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ServingError(f"JSON Parse error: {exc}") from None
    except RecursionError:  # arrays or objects nested deeper than Python's recursion limit
        raise ServingError(f"JSON Parse error: the body nests arrays or objects deeper than "
                           f"{sys.getrecursionlimit()} levels; a tensor has at most {MAX_DIMS} dimensions.") from None


def status_reply(states: list[tuple[int, str]]) -> dict[str, Any]:
    """``GET /v1/models/{name}``'s body, as TF Serving writes it (versions as strings)."""
    return {"model_version_status": [
        {"version": str(v), "state": state, "status": {"error_code": "OK", "error_message": ""}}
        for v, state in states]}


def _version(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit():
        raise ServingError(f"A model version must be a non-negative integer. Received: {text!r}")
    return int(text)


class _Completions:
    """Predictions handed from the model's threads to the event loop with one wake-up per burst: a
    batch that answers 32 requests wakes the loop once, not 32 times, and each reply is written
    out by the drain that finishes it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._ready: list[tuple[Pending, Any, Callable[[Any], Reply]]] = []
        self._lock = threading.Lock()

    def ready(self, pending: Pending, outcome: Any, finish: Callable[[Any], Reply]) -> None:
        """Called on a model's thread: ``pending`` is resolved with ``finish(outcome)`` on the loop."""
        with self._lock:
            self._ready.append((pending, outcome, finish))
            if len(self._ready) > 1:
                return  # a wake-up is on its way already
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    def _drain(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for pending, outcome, finish in ready:
            pending.resolve(finish(outcome))


def _error(status: int, message: str) -> Reply:
    return Reply(status, json.dumps({"error": message}).encode())


def _json(value: Any, status: int = 200) -> Reply:
    return Reply(status, json.dumps(value).encode())


class RestApi:
    """TF Serving's REST API over a :class:`~tensorfleet.serving.predictor.Predictor`:
    ``(method, path, body)`` in, a :class:`~tensorfleet.serving.http.Reply` (or a pending one) out."""

    def __init__(self, predictor: Front, loop: asyncio.AbstractEventLoop) -> None:
        self.predictor = predictor
        self.repository = predictor.repository
        self._completions = _Completions(loop)
        self._get = {"/monitoring/prometheus/metrics": self._metrics, "/healthz": self._healthz,
                     "/readyz": self._readyz}
        self._paths: dict[str, tuple[str | None, ...]] = {}  # what follows /v1/models/ -> its parts

    def __call__(self, method: str, path: str, body: bytes) -> Reply | Pending:
        if path.startswith(_MODELS):
            return self.models(method, path[len(_MODELS):], body)
        page = self._get.get(path)
        if page is None:
            return _error(404, f"Not Found: {method} {path}")
        if method != "GET":
            return _error(405, f"{path} takes GET. Received: {method}")
        return page()

    def _metrics(self) -> Reply:
        return Reply(200, self.predictor.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")

    def _healthz(self) -> Reply:
        return _json({"status": "alive"})

    def _readyz(self) -> Reply:
        ready = self.predictor.ready
        return _json({"ready": ready, "versions": self.repository.versions}, 200 if ready else 503)

    def _parts(self, rest: str) -> tuple[Any, ...] | None:
        """``(name, version, label, meta, verb)`` of a path below /v1/models/ (None: malformed); a path not
        seen lately is parsed and kept, since the same few paths come again and again."""
        parts = self._paths.get(rest)
        if parts is None and (match := _PATH.match(rest)):
            if len(self._paths) >= 1024:
                self._paths.clear()
            parts = self._paths[rest] = (match["name"], match["version"], match["label"], match["meta"], match["verb"])
        return parts

    def models(self, method: str, rest: str, body: bytes) -> Reply | Pending:
        parts = self._parts(rest)
        if parts is None:
            return _error(404, f"Malformed request: {method} {_MODELS}{rest}")
        name, version_text, label, meta, verb = parts
        try:
            version = _version(version_text)
            if verb is not None:
                if verb != "predict":
                    return _error(400 if verb in ("classify", "regress") else 404,
                                  f"Only :predict is served; {verb!r} is not (signature method not supported).")
                if method != "POST":
                    return _error(405, f":predict takes POST. Received: {method}")
                return self.predict(name, version, label, body)
            if method != "GET":
                return _error(405, f"{_MODELS}{rest} takes GET. Received: {method}")
            if meta:
                return _json(self.metadata(name, version, label))
            if label:
                return _error(404, "Model status is asked by version, not label.")
            return _json(status_reply(self.repository.status(name, version)))
        except Exception as exc:  # a bad request answers 4xx; the server stays up
            return _failure(exc)

    def predict(self, name: str, version: int | None, label: str | None, raw: bytes) -> Pending:
        servable, inputs = self._row_inputs(name, version, label, raw)
        sig_name, rows = None, True
        if inputs is None:
            body = decode_body(raw)
            servable = servable or self.repository.get(name, version, label)
            sig_name = body.get("signature_name") if isinstance(body, dict) else None
            inputs, rows = parse_predict_body(body, servable.signature(sig_name))
        pending = Pending()

        def finish(outcome: dict[str, np.ndarray] | BaseException) -> Reply:  # on the loop, after submit returned
            if isinstance(outcome, BaseException):
                return _failure(outcome)
            try:
                return Reply(200, encode_reply({k: outcome[k] for k in prediction.outputs}, rows))
            except Exception as exc:
                return _failure(exc)

        completions = self._completions
        prediction = self.predictor.submit(name, inputs, version=version, label=label, signature_name=sig_name,
                                           servable=servable,
                                           done=lambda outcome: completions.ready(pending, outcome, finish))
        return pending

    def _row_inputs(self, name: str, version: int | None, label: str | None,
                    raw: bytes) -> tuple[Servable | None, dict[str, np.ndarray] | None]:
        """(the servable, its inputs) when the body is the common row form that :func:`read_instances`
        reads for the default signature's one input; else (the servable or None, None), and the body
        is read in full (a request for a model or version not served fails there, after the body's
        own errors, as it always has)."""
        try:
            servable = self.repository.get(name, version, label)
        except ServingError:
            return None, None
        signature = servable.signatures.get("serving_default")
        if signature is None or signature.row_shape is None or signature.row_input is None:  # set together
            return servable, None
        array = read_instances(raw, signature.row_shape)
        return servable, None if array is None else {signature.row_input: array}

    def metadata(self, name: str, version: int | None, label: str | None) -> dict[str, Any]:
        from google.protobuf.json_format import MessageToDict

        servable = self.repository.get(name, version, label)
        defs = {k: MessageToDict(v, preserving_proto_field_name=True) for k, v in servable.signature_defs().items()}
        return {"model_spec": {"name": name, "signature_name": "", "version": str(servable.version)},
                "metadata": {"signature_def": {"signature_def": defs}}}


def _failure(exc: BaseException) -> Reply:
    error = as_serving_error(exc)
    return _error(error.http_status, error.message)


# HTTP status -> the status name the request metrics count it under.
_STATUS_NAMES = {200: "OK", 400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 405: "UNIMPLEMENTED", 413: "RESOURCE_EXHAUSTED",
                 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when installed (libuv's: less CPU per request than asyncio's own), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is in the lock file
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class RestServer:
    """The REST front on its own thread and event loop; :meth:`stop` drains in-flight requests."""

    def __init__(self, predictor: Front, host: str, port: int, *, max_body_bytes: int = 4 << 20,
                 drain_seconds: float = 10.0) -> None:
        self.host, self.port, self.drain_seconds = host, port, drain_seconds
        self._loop = new_event_loop()
        metrics = predictor.metrics

        models: dict[str, str | None] = {}  # path -> the model it names, found once per path

        def observe(path: str, status: int, seconds: float) -> None:
            if path.startswith("/v1/"):
                model = models.get(path, "")
                if model == "":
                    if len(models) >= 1024:
                        models.clear()
                    model = models[path] = (re.split(r"[/:]", path[len(_MODELS):], maxsplit=1)[0]
                                            if path.startswith(_MODELS) else None)
                metrics.observe_request("rest", _STATUS_NAMES.get(status, str(status)), seconds, model=model)

        self._http = HttpServer(RestApi(predictor, self._loop), _error, max_body_bytes=max_body_bytes,
                                observe=observe)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._started = False
        self._thread = threading.Thread(target=self._serve, name="tfl-serving-rest", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"The REST server did not start within {timeout:g}s.")
        if self._error is not None:
            raise OSError(f"Could not serve REST on {self.host}:{self.port}: {self._error}") from self._error

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._http.start(self.host, self.port))
        except BaseException as exc:  # reported to start()'s caller
            self._error = exc
            self._ready.set()
            self._loop.close()
            return
        self._started = True
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def stop(self) -> None:
        """Stops listening, lets requests in flight finish (up to ``drain_seconds``), then stops the loop."""
        if not self._started or not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._http.stop(self.drain_seconds),
                                         self._loop).result(self.drain_seconds + 10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.drain_seconds + 10)
