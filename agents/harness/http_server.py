"""The endpoint's HTTP plumbing: a threading HTTP/1.1 server on a Unix socket whose handler
hands every request to the `RolloutEndpoint` and writes its JSON or event-stream answers.

Kept apart from `endpoint` (what a request means) so each reads on its own: keep-alive, the
body size cap, SSE as chunked transfer (a stream's head and first events in one write), and a
listener that remembers its connections so the endpoint's exit can close them.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

import orjson

from agents.harness.calls import CallError
from agents.llm.backends.abstract import decode_body

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024  # a whole conversation with long tool outputs fits


def _chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (none for no data: an empty chunk would end the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 plumbing; the endpoint decides everything."""

    protocol_version = "HTTP/1.1"
    server: Server
    extra_headers: dict[str, str]
    body_read: bool
    received: float

    def handle_one_request(self) -> None:
        self.extra_headers, self.body_read = {}, False
        super().handle_one_request()

    def parse_request(self) -> bool:
        self.received = time.monotonic()  # the request line is in: a call's TTFT counts from here
        return super().parse_request()

    def do_GET(self) -> None:
        self.server.endpoint.serve(self)

    do_POST = do_GET

    def read_json(self) -> dict[str, Any]:
        """The request body as a JSON object."""
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY_BYTES:
            raise CallError("invalid_request", f"request body over {MAX_BODY_BYTES} bytes", 413)
        raw = self.rfile.read(length)
        self.body_read = True
        try:
            body = decode_body(raw or b"null")
        except ValueError as exc:
            raise CallError("invalid_request", f"the body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise CallError("invalid_request", "the body must be a JSON object")
        return body

    def send_json(self, status: int, body: dict[str, Any]) -> None:
        """A JSON answer."""
        try:
            data = orjson.dumps(body)
        except TypeError:  # what orjson cannot write (an integer past 64 bits a model wrote)
            data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self._send_extra_headers()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        # Head and body in one write: two woke the harness's reader twice (~0.5-1 ms a call
        # on a loaded machine, `bench/harness_endpoint.py`).
        self._headers_buffer.append(b"\r\n" + data)
        self.flush_headers()

    def send_sse(self, events: Iterable[str]) -> None:
        """A server-sent-events answer, chunked (the connection stays usable)."""
        self.sse_open(events)
        self.sse_close()

    def sse_open(self, events: Iterable[str] = ()) -> None:
        """The head of an event stream and its first events, in one write (the first the
        harness sees: its time to first token; one wake-up of its reader, not two)."""
        self.send_response(200)
        self._send_extra_headers()
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self._headers_buffer.append(b"\r\n" + _chunk("".join(events).encode()))
        self.flush_headers()

    def sse_write(self, events: Iterable[str]) -> None:
        """Events (each framed already), as one chunk written at once."""
        data = "".join(events).encode()
        if data:
            self.wfile.write(_chunk(data))
            self.wfile.flush()

    def sse_close(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _send_extra_headers(self) -> None:
        if not self.body_read and int(self.headers.get("content-length") or 0) > 0:
            # Answered before reading the body (401, 404, 413): the rest of it would be
            # taken for the next request on this connection, so the connection ends here.
            self.close_connection = True
            self.send_header("Connection", "close")
        for name, value in self.extra_headers.items():
            self.send_header(name, value)

    def address_string(self) -> str:
        return "unix-socket"  # a Unix socket peer has no address

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("endpoint: " + format, *args)


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The Unix-socket server; remembers its connections so exit can close them."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, endpoint: Any) -> None:
        self.endpoint = endpoint
        self._connections: set[socket.socket] = set()
        self._guard = threading.Lock()
        super().__init__(path, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._guard:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._guard:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_all(self) -> None:
        """Close the listener and every open connection."""
        self.server_close()
        with self._guard:
            connections, self._connections = list(self._connections), set()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
