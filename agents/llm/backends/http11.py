"""A lean HTTP/1.1 exchange for generation calls: httptools' parser over httpcore's streams.

A generation call through httpcore's pool cost ~0.45 ms of CPU more than the same request on a
raw socket (0.46-0.62 against 0.04-0.06 ms a call, SmolLM2 simulator, 2026-12-06): its pool's
bookkeeping and h11's pure-Python parsing of the response head. That was a quarter of what a
harness's call through its rollout endpoint adds over the bare request (issue 36). Here the
request is one write, the response is parsed by httptools (the C llhttp parser uvicorn uses),
and a connection goes back to a small per-origin idle list once its response was read whole.

What stays httpcore's, so nothing around it changes: the network streams, made by the same
backends (`abort.RecordingBackend`: a call's abort handle finds and cuts its connection;
`guard.GuardedBackend`: a tenant's URL connects only where the rules allow), TLS (`start_tls`),
per-read timeouts and the exceptions (`http_client.TRANSPORT_ERRORS` catches all this raises).
A pooled connection the server has closed (readable while idle) or one idle longer than the
keep-alive expiry is dropped before use, as httpcore's pool does; one whose write fails is
replaced once by a new connection.

`while_server_works(callback)` runs work that must be done before an answer is used, but not
before the request is sent, in the time the server spends on it (the harness endpoint checks a
prompt's template delta there: `agents.llm.trajectory`).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator

import httpcore
import httptools

from agents.llm.backends.abort import aborted

READ_BYTES = 64 * 1024
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110 token)
_UNSAFE = re.compile(rb"[\r\n\0]")  # what would end a header value early (a smuggled header)
_UNSAFE_TARGET = re.compile(r"[\s\0]")  # what would end the request line early
_sent = threading.local()  # .callback: run once this thread's next request is written


@contextlib.contextmanager
def while_server_works(callback: Callable[[], None]) -> Iterator[None]:
    """Run `callback` once, right after this thread's next request is written and before its
    answer is read: while the server works on it. An error it raises closes the connection
    (the server drops the request) and is raised to the caller; if no request is sent, the
    callback is not run (the caller does the work itself then)."""
    _sent.callback = callback
    try:
        yield
    finally:
        _sent.callback = None


def _after_write() -> None:
    callback = getattr(_sent, "callback", None)
    if callback is not None:
        _sent.callback = None
        callback()


class _Parsed:
    """httptools' callbacks: the response as far as it was parsed."""

    __slots__ = ("parser", "head_done", "headers", "chunks", "complete", "delimited", "keep_alive", "interim")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.interim = False  # parsing an interim (1xx) response: skipped, the final one follows
        self.head_done = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.complete = False
        self.delimited = False  # a length or chunks say where the body ends (else: the close)
        self.keep_alive = False  # read at the message's end (the parser forgets it after)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.delimited = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # 100 Continue, 103 Early Hints: not the answer
            self.interim, self.headers, self.delimited = True, [], False
            return
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise httpcore.RemoteProtocolError(f"an invalid HTTP response: {exc}") from None


class Exchange:
    """One request's response, its head read: `status`, `headers`, then `chunks()`; `close()`
    gives the connection back when the body was read to its end (else closes it)."""

    def __init__(self, lane: Lane, stream: httpcore.NetworkStream, parsed: _Parsed, timeout: float) -> None:
        self._lane = lane
        self._stream: httpcore.NetworkStream | None = stream
        self._parsed = parsed
        self._timeout = timeout
        self.status: int = parsed.parser.get_status_code()
        self.headers = parsed.headers

    def chunks(self) -> Iterator[bytes]:
        """The body's bytes as they arrive (de-chunked)."""
        parsed = self._parsed
        while True:
            if parsed.chunks:
                chunks, parsed.chunks = parsed.chunks, []
                yield b"".join(chunks)
            if parsed.complete or self._stream is None:
                return
            data = self._stream.read(READ_BYTES, self._timeout)
            if not data and not parsed.delimited:
                parsed.complete = True  # a body that ends with the connection (never kept)
                return
            if not data:
                raise httpcore.RemoteProtocolError("the server closed the connection before the response ended")
            parsed.feed(data)

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        parsed = self._parsed
        parsed.parser = None  # it holds `parsed`: no cycle left for the collector
        if parsed.complete and parsed.keep_alive:
            self._lane.release(stream)
        else:
            stream.close()


class Lane:
    """Keep-alive HTTP/1.1 connections to one origin (up to `slots` idle ones)."""

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        backend: httpcore.NetworkBackend,
        ssl_context: object,
        slots: int,
        expiry: float,
    ) -> None:
        self.scheme, self.host, self.port = scheme, host, port
        self._backend = backend
        self._ssl_context = ssl_context
        self._slots = slots
        self._expiry = expiry
        self._idle: list[tuple[httpcore.NetworkStream, float]] = []
        self._lock = threading.Lock()

    def open(self, request: bytes, timeout: float, bodiless: bool = False) -> Exchange:
        """Send `request` (head and body, whole) and read the response's head (`bodiless`:
        the answer to a HEAD request, which has no body whatever its length says). A pooled
        connection whose write fails (the server had closed it) is replaced once; one that
        fails after the request went out is not: the server may have taken the request (a
        restart mid-request), and asking again is the session's call (a paused server, a
        failover), as with httpcore."""
        stream, reused = self._connection(timeout)
        parsed = _Parsed()
        try:
            try:
                stream.write(request, timeout)
            except httpcore.WriteError:
                stream.close()
                if not reused or aborted():  # an abort cut it: no second try
                    raise
                stream = self._connect(timeout)
                stream.write(request, timeout)
            _after_write()
            while not parsed.head_done:
                data = stream.read(READ_BYTES, timeout)
                if not data:
                    raise httpcore.RemoteProtocolError("the server closed the connection without a response")
                parsed.feed(data)
            if bodiless:
                parsed.complete, parsed.keep_alive = True, False  # not kept: simplest safe
        except BaseException:
            parsed.parser = None
            stream.close()
            raise
        return Exchange(self, stream, parsed, timeout)

    def release(self, stream: httpcore.NetworkStream) -> None:
        """Keep `stream` (its last response read whole) for the next request."""
        with self._lock:
            if len(self._idle) < self._slots:
                self._idle.append((stream, time.monotonic()))
                return
        stream.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for stream, _ in idle:
            stream.close()

    def _connection(self, timeout: float) -> tuple[httpcore.NetworkStream, bool]:
        """(a connection, whether it was pooled)."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    break
                stream, since = self._idle.pop()
            if now - since < self._expiry and not stream.get_extra_info("is_readable"):
                return stream, True
            stream.close()  # the server closed it, or it idled past the expiry
        return self._connect(timeout), False

    def _connect(self, timeout: float) -> httpcore.NetworkStream:
        stream = self._backend.connect_tcp(self.host, self.port, timeout=timeout)
        if self.scheme == "https":
            stream = stream.start_tls(self._ssl_context, server_hostname=self.host, timeout=timeout)
        return stream


def request_bytes(method: str, target: str, fields: list[tuple[bytes, bytes]], body: bytes | None) -> bytes:
    """The request's head and body (`target`: the path and query)."""
    if _UNSAFE_TARGET.search(target):
        raise httpcore.LocalProtocolError(f"a request target that is not valid HTTP: {target[:80]!r}")
    lines = [f"{method} {target} HTTP/1.1".encode()]
    for name, value in fields:
        if not _TOKEN.fullmatch(name) or _UNSAFE.search(value):
            raise httpcore.LocalProtocolError(f"a header that is not valid HTTP: {name[:40]!r}")
        lines.append(name + b": " + value)
    if body is not None:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")
