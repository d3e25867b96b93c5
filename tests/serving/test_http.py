"""The REST front's HTTP/1.1 server on a raw socket: pipelined requests answered in order, chunked
bodies, Expect: 100-continue, Connection: close, a chunked body over the limit (413 after reading
it, the connection kept), a request target too long (414) and a malformed request (400, then the
connection closes), and idle keep-alive connections closed."""

from __future__ import annotations

import json
import socket

import numpy as np

from .conftest import assert_float32_close


def _exchange(port: int, data: bytes, replies: int = 1) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """Sends ``data`` on one connection and reads ``replies`` replies: (status line, headers, body)."""
    out, buffer = [], b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        while len(out) < replies:
            while b"\r\n\r\n" not in buffer:
                chunk = sock.recv(65536)
                assert chunk, f"the server closed the connection after {len(out)} replies"
                buffer += chunk
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            status, *lines = head.split(b"\r\n")
            headers = {k.lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines)}
            if status.startswith(b"HTTP/1.1 100"):
                continue
            length = int(headers[b"content-length"])
            while len(buffer) < length:
                buffer += sock.recv(65536)
            out.append((status, headers, buffer[:length]))
            buffer = buffer[length:]
    return out


def _post(body: bytes, *extra: str) -> bytes:
    head = "\r\n".join(["POST /v1/models/digits/versions/1:predict HTTP/1.1", "Host: x", *extra])
    return head.encode() + b"\r\n\r\n" + body


def test_pipelined_requests_are_answered_in_order(server):
    data = b"GET /v1/models/digits/versions/2 HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    first, second = _exchange(server.rest_api_port, data, replies=2)
    assert first[0] == b"HTTP/1.1 200 OK" and json.loads(first[2])["model_version_status"][0]["version"] == "2"
    assert second[0] == b"HTTP/1.1 200 OK" and second[2] == b'{"status": "alive"}'
    assert second[1][b"content-type"] == b"application/json"


def test_chunked_and_100_continue_bodies_are_read_whole(server, digits_models, images):
    body = json.dumps({"instances": images[:2].tolist()}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:100], body[100:])) + b"0\r\n\r\n"
    expected = digits_models[1].predict(images[:2], verbose=0)
    for data in (_post(chunked, "Transfer-Encoding: chunked"),
                 _post(body, f"Content-Length: {len(body)}", "Expect: 100-continue")):
        [(status, _, reply)] = _exchange(server.rest_api_port, data)
        assert status == b"HTTP/1.1 200 OK"
        assert_float32_close(np.array(json.loads(reply)["predictions"], np.float32), expected)


def test_connection_close_is_honoured(server):
    [(status, headers, _)] = _exchange(server.rest_api_port, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == b"HTTP/1.1 200 OK" and headers[b"connection"] == b"close"


def test_a_chunked_body_over_the_limit_gets_413_a_long_target_414_and_a_malformed_request_400(server):
    part = b"0," * 20000
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for _ in range(4)) + b"0\r\n\r\n"
    [(status, headers, reply)] = _exchange(server.rest_api_port, _post(chunked, "Transfer-Encoding: chunked"))
    assert status == b"HTTP/1.1 413 Request Entity Too Large" and b"connection" not in headers  # body read: kept
    assert json.loads(reply) == {"error": "Request body too large: 160000 bytes, over the server's max_request_bytes "
                                          "65536 (--max-request-size on the command line)."}
    [(status, headers, reply)] = _exchange(server.rest_api_port, b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n")
    assert status == b"HTTP/1.1 414 Request-URI Too Long" and headers[b"connection"] == b"close"
    assert json.loads(reply) == {"error": "The request target is longer than 8192 bytes."}
    [(status, headers, reply)] = _exchange(server.rest_api_port, b"NOT HTTP AT ALL\r\n\r\n")
    assert status == b"HTTP/1.1 400 Bad Request" and headers[b"connection"] == b"close"
    assert json.loads(reply)["error"].startswith("Malformed HTTP request: ")


def test_an_idle_keep_alive_connection_is_closed_and_a_busy_one_is_not():
    import asyncio
    import threading
    import time

    import portpicker

    from tensorfleet.serving.http import HttpServer, Reply

    loop = asyncio.new_event_loop()
    port = portpicker.pick_unused_port()
    slow: asyncio.Future = loop.create_future()

    def handler(method: str, path: str, body: bytes):
        return slow if path == "/slow" else Reply(200, b"{}")

    server = HttpServer(handler, lambda status, message: Reply(status, b"{}"), max_body_bytes=100, idle_seconds=0.4)
    loop.run_until_complete(server.start("127.0.0.1", port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle, \
                socket.create_connection(("127.0.0.1", port), timeout=10) as busy:
            busy.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
            time.sleep(1.5)
            assert idle.recv(100) == b""  # closed by the server
            loop.call_soon_threadsafe(slow.set_result, Reply(200, b'{"late": 1}'))
            assert busy.recv(1000).endswith(b'\r\n\r\n{"late": 1}')
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(1.0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
