"""The REST front's HTTP/1.1 server: an asyncio protocol over httptools (llhttp, Node.js's parser).

It does what TF Serving's REST API needs and no more: keep-alive and pipelined requests
(answered in order), chunked or sized bodies, ``Expect: 100-continue``, a body limit (413 once
the body has been read, so the client sees the reply rather than a reset), malformed requests
(400, then the connection closes), a request target over 8 KiB (414), idle keep-alive connections closed after
``idle_seconds``, and a drain on stop (stop listening, finish what is in flight, close). A handler gets ``(method, path,
body)`` and returns a :class:`Reply`, or a :class:`Pending` reply for work that runs elsewhere (a prediction), or an
asyncio future of one. Nothing per request is built that the reply does not need: a pending reply is written by the call
that resolves it (no event-loop callback per reply), and the head of a reply is made once per
status, content type and length, so a request costs the event loop a few tens of microseconds.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable, Union
from urllib.parse import unquote

import httptools

__all__ = ["HttpServer", "Pending", "Reply"]


@dataclass(frozen=True)
class Reply:
    """One HTTP reply: status, body and its content type."""

    status: int
    body: bytes
    content_type: str = "application/json"


class Pending:
    """A reply still being computed elsewhere. Whoever computes it calls :meth:`resolve` on the
    server's event-loop thread, which writes it out at once (replies still leave in request order).

    Example:
        >>> pending = Pending()
        >>> pending.resolve(Reply(200, b"{}"))
        >>> pending.reply.status
        200
    """

    __slots__ = ("reply", "_connection", "_slot")

    def __init__(self) -> None:
        self.reply: Reply | None = None
        self._connection: _Connection | None = None
        self._slot: _Slot | None = None

    def resolve(self, reply: Reply) -> None:
        """Hands ``reply`` to the connection that waits for it (the first call only counts)."""
        if self.reply is None:
            self.reply = reply
            if self._connection is not None and self._slot is not None:  # set together by _deliver_to
                self._connection._fill(self._slot, reply)

    def _deliver_to(self, connection: _Connection, slot: _Slot) -> None:
        if self.reply is not None:
            connection._fill(slot, self.reply)
        else:
            self._connection, self._slot = connection, slot


Handler = Callable[[str, str, bytes], Union[Reply, Pending, "asyncio.Future[Reply]"]]
# (path, status, seconds from the request's last byte to its reply) for every answered request.
Observer = Callable[[str, int, float], None]

_PHRASES = {s.value: s.phrase for s in HTTPStatus}
MAX_URL_BYTES = 8192  # a longer request target is refused (414) before it is held in memory
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


_HEADS: dict[tuple[int, str, int, bool], bytes] = {}  # made once per (status, type, length, close)


def _head(status: int, content_type: str, length: int, close: bool) -> bytes:
    key = (status, content_type, length, close)
    head = _HEADS.get(key)
    if head is None:
        if len(_HEADS) >= 4096:
            _HEADS.clear()
        connection = "Connection: close\r\n" if close else ""
        head = _HEADS[key] = (f"HTTP/1.1 {status} {_PHRASES.get(status, 'Unknown')}\r\nContent-Type: {content_type}"
                              f"\r\nContent-Length: {length}\r\n{connection}\r\n").encode()
    return head


class _Slot:
    """A request of a connection waiting for its reply (replies go out in request order)."""

    __slots__ = ("path", "start", "reply", "close")

    def __init__(self, path: str, close: bool) -> None:
        self.path, self.start, self.close = path, time.perf_counter(), close
        self.reply: Reply | None = None


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.slots: deque[_Slot] = deque()
        self.closing = False
        self._url = b""
        self._body: list[bytes] = []
        self._size = 0
        self._expected = 0
        self._continue = False
        self.last = time.monotonic()

    # asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.server.connections.add(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server.connections.discard(self)
        self.closing = True

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if self.closing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "Protocol upgrades are not served.")
        except httptools.HttpParserError as exc:
            if len(self._url) > MAX_URL_BYTES:
                self._refuse(414, f"The request target is longer than {MAX_URL_BYTES} bytes.")
            else:
                self._refuse(400, f"Malformed HTTP request: {exc}")

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self._url, self._body, self._size, self._expected, self._continue = b"", [], 0, 0, False

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_URL_BYTES:
            raise ValueError("request target too long")  # the parser stops: data_received answers 414

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name)  # only two headers matter here: the others are passed over by their length
        if size == 14 and name.lower() == b"content-length" and value.strip().isdigit():
            self._expected = int(value)
        elif size == 6 and name.lower() == b"expect" and value.strip().lower() == b"100-continue":
            self._continue = True

    def on_headers_complete(self) -> None:
        if self._continue and self._expected <= self.server.max_body_bytes:
            self.transport.write(_CONTINUE)

    def on_body(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= self.server.max_body_bytes:
            self._body.append(chunk)
        else:
            self._body = []  # read on to the end, kept no longer: the client gets its 413, not a reset

    def on_message_complete(self) -> None:
        url = self._url.split(b"?", 1)[0].decode("latin-1")
        path = unquote(url) if "%" in url else url
        close = self.server.draining or not self.parser.should_keep_alive()
        slot = _Slot(path, close)
        self.slots.append(slot)
        if self._size > self.server.max_body_bytes:
            return self._fill(slot, self.server.too_large(self._size))
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        try:
            result = self.server.handler(self.parser.get_method().decode("latin-1"), path, body)
        except Exception as exc:  # a handler's own failure still answers
            result = self.server.internal_error(exc)
        if isinstance(result, Reply):
            self._fill(slot, result)
        elif isinstance(result, Pending):
            result._deliver_to(self, slot)
        else:
            result.add_done_callback(lambda future: self._fill(slot, self.server.outcome(future)))

    # replies
    def _fill(self, slot: _Slot, reply: Reply) -> None:
        slot.reply = reply
        while self.slots and self.slots[0].reply is not None:
            done = self.slots.popleft()
            assert done.reply is not None  # the loop's condition (mypy does not carry it past popleft)
            close = done.close or (self.server.draining and not self.slots)
            if not self.closing:
                self.transport.write(_head(done.reply.status, done.reply.content_type, len(done.reply.body), close)
                                     + done.reply.body)
            self.server.observe(done.path, done.reply.status, time.perf_counter() - done.start)
            self.last = time.monotonic()
            if close:
                self._close()
                return

    def _refuse(self, status: int, message: str) -> None:
        reply = self.server.error(status, message)
        if not self.closing:
            self.transport.write(_head(status, reply.content_type, len(reply.body), True) + reply.body)
        self._close()

    def _close(self) -> None:
        self.closing = True
        self.slots.clear()
        self.transport.close()

    def drain(self) -> None:
        """Closes now if idle; else the last reply in flight closes the connection."""
        if not self.slots:
            self._close()


class HttpServer:
    """Serves ``handler`` on one event loop.

    Args:
        handler: ``(method, path, body) -> Reply | Pending | Future[Reply]``.
        error: ``(status, message) -> Reply`` for what the server refuses itself (400, 413, 500).
        max_body_bytes: bodies over this get 413.
        observe: called with (path, status, seconds) for every answered request.
        idle_seconds: a keep-alive connection with nothing in flight is closed after this long
            without a byte from its client (as aiohttp's keep-alive timeout; 75 s by default).
    """

    def __init__(self, handler: Handler, error: Callable[[int, str], Reply], *, max_body_bytes: int,
                 observe: Observer | None = None, idle_seconds: float = 75.0) -> None:
        self.handler, self.error, self.max_body_bytes = handler, error, max_body_bytes
        self.idle_seconds = idle_seconds
        self._sweeper: asyncio.TimerHandle | None = None
        self.observe = observe or (lambda path, status, seconds: None)
        self.connections: set[_Connection] = set()
        self.draining = False
        self._server: asyncio.base_events.Server | None = None

    def too_large(self, size: int) -> Reply:
        return self.error(413, f"Request body too large: {size} bytes, over the server's max_request_bytes "
                               f"{self.max_body_bytes} (--max-request-size on the command line).")

    def internal_error(self, exc: BaseException) -> Reply:
        return self.error(500, f"{type(exc).__name__}: {exc}")

    def outcome(self, future: asyncio.Future) -> Reply:
        if future.cancelled():
            return self.error(503, "The request was cancelled: the server is stopping.")
        exc = future.exception()
        return future.result() if exc is None else self.internal_error(exc)

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=1024)
        self._sweeper = loop.call_later(self.idle_seconds / 4, self._sweep)

    def _sweep(self) -> None:
        """Closes the keep-alive connections idle for longer than ``idle_seconds``."""
        oldest = time.monotonic() - self.idle_seconds
        for connection in list(self.connections):
            if not connection.slots and connection.last < oldest:
                connection._close()
        self._sweeper = asyncio.get_running_loop().call_later(self.idle_seconds / 4, self._sweep)

    async def stop(self, drain_seconds: float) -> None:
        """Stops listening, lets the requests in flight be answered (up to ``drain_seconds``), closes."""
        self.draining = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.drain()
        deadline = time.monotonic() + drain_seconds
        while any(c.slots for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection._close()
