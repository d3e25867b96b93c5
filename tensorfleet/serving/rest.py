"""TF Serving's REST API on aiohttp.

``GET /v1/models/{name}[/versions/{v}]`` (version status), ``GET .../metadata`` (signatures) and
``POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict`` with the row (``instances``) or
columnar (``inputs``) format, answered with ``predictions`` or ``outputs``; metrics at TF Serving's
``/monitoring/prometheus/metrics``, liveness at ``/healthz`` and readiness at ``/readyz``. Every refusal is
``{"error": "..."}`` with TF Serving's HTTP status (400 bad input, 404 unknown model or version,
413 body over the limit, 405 wrong method).

The body's JSON is parsed on the event loop; the model runs on the batcher's threads or the
predictor's pool, so slow predictions never stop the server from reading other requests.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from typing import Any

import numpy as np
from aiohttp import web

from tensorfleet.serving.errors import ServingError, as_serving_error
from tensorfleet.serving.metrics import ServingMetrics
from tensorfleet.serving.predictor import Predictor
from tensorfleet.serving.servable import Signature

__all__ = ["RestServer", "make_app", "parse_predict_body", "predict_reply", "status_reply"]

_METRICS = web.AppKey("metrics", ServingMetrics)
_PATH = re.compile(r"^(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
                   r"(?:(?P<meta>/metadata)|:(?P<verb>[A-Za-z]+))?$")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


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


class _Handlers:
    def __init__(self, predictor: Predictor) -> None:
        self.predictor = predictor
        self.repository = predictor.repository

    async def route(self, request: web.Request) -> web.Response:
        match = _PATH.match(request.match_info["rest"])
        if not match:
            return _error(404, f"Malformed request: {request.method} {request.path}")
        name, label, meta, verb = match["name"], match["label"], match["meta"], match["verb"]
        try:
            version = _version(match["version"])
            if verb is not None:
                if verb != "predict":
                    return _error(400 if verb in ("classify", "regress") else 404,
                                  f"Only :predict is served; {verb!r} is not (signature method not supported).")
                if request.method != "POST":
                    return _error(405, f":predict takes POST. Received: {request.method}")
                return await self.predict(request, name, version, label)
            if request.method != "GET":
                return _error(405, f"{request.path} takes GET. Received: {request.method}")
            if meta:
                return web.json_response(self.metadata(name, version, label))
            if label:
                return _error(404, "Model status is asked by version, not label.")
            return web.json_response(status_reply(self.repository.status(name, version)))
        except web.HTTPException:  # aiohttp's own (413 body too large): the middleware shapes it
            raise
        except Exception as exc:  # a bad request answers 4xx; the server stays up
            error = as_serving_error(exc)
            return _error(error.http_status, error.message)

    async def predict(self, request: web.Request, name: str, version: int | None, label: str | None) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ServingError(f"JSON Parse error: {exc}") from None
        servable = self.repository.get(name, version, label)
        sig_name = body.get("signature_name") if isinstance(body, dict) else None
        inputs, rows = parse_predict_body(body, servable.signature(sig_name))
        prediction = self.predictor.submit(name, inputs, version=version, label=label, signature_name=sig_name,
                                           servable=servable)
        outputs = await asyncio.wrap_future(prediction.future)
        reply = predict_reply({k: outputs[k] for k in prediction.outputs}, rows)
        return web.Response(text=json.dumps(reply), content_type="application/json")

    def metadata(self, name: str, version: int | None, label: str | None) -> dict[str, Any]:
        from google.protobuf.json_format import MessageToDict

        servable = self.repository.get(name, version, label)
        defs = {k: MessageToDict(v, preserving_proto_field_name=True) for k, v in servable.signature_defs().items()}
        return {"model_spec": {"name": name, "signature_name": "", "version": str(servable.version)},
                "metadata": {"signature_def": {"signature_def": defs}}}


# HTTP status -> the status name the request metrics count it under.
_STATUS_NAMES = {200: "OK", 400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 405: "UNIMPLEMENTED", 413: "RESOURCE_EXHAUSTED",
                 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


async def _answer(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:  # aiohttp's own refusals (413, 404 ...) in TF Serving's shape too
        if exc.status < 400:
            raise
        if exc.status == 413:
            return _error(413, f"Request body too large: {exc.text.rstrip('.')} bytes (the server's "
                               "max_request_bytes, --max-request-size on the command line).")
        return _error(exc.status, exc.reason)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    start = time.perf_counter()
    response = await _answer(request, handler)
    if request.path.startswith("/v1/"):
        request.app[_METRICS].observe_request("rest", _STATUS_NAMES.get(response.status, str(response.status)),
                                               time.perf_counter() - start)
    return response


def make_app(predictor: Predictor, *, max_body_bytes: int = 4 << 20) -> web.Application:
    """The aiohttp application serving ``predictor`` (bodies over ``max_body_bytes`` get 413)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_json_errors])
    app[_METRICS] = predictor.metrics
    app.router.add_route("*", "/v1/models/{rest:.*}", _Handlers(predictor).route)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=predictor.metrics.render(), content_type="text/plain")

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def readyz(request: web.Request) -> web.Response:
        ready = predictor.ready
        return web.json_response({"ready": ready, "versions": predictor.repository.versions},
                                 status=200 if ready else 503)

    app.router.add_get("/monitoring/prometheus/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


class RestServer:
    """The REST front on its own thread and event loop; :meth:`stop` drains in-flight requests."""

    def __init__(self, predictor: Predictor, host: str, port: int, *, max_body_bytes: int = 4 << 20,
                 drain_seconds: float = 10.0) -> None:
        self.host, self.port, self.drain_seconds = host, port, drain_seconds
        self._app = make_app(predictor, max_body_bytes=max_body_bytes)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._runner: web.AppRunner | None = None
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
            self._runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=self.drain_seconds)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port)
            self._loop.run_until_complete(site.start())
        except BaseException as exc:  # reported to start()'s caller
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def stop(self) -> None:
        """Stops listening, lets requests in flight finish (up to ``drain_seconds``), then stops the loop."""
        if self._runner is None or not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(self.drain_seconds + 10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.drain_seconds + 10)
