"""The endpoint's HTTP plumbing: a threading HTTP/1.1 server on a Unix socket whose handler
hands every request to the `RolloutEndpoint` and writes its JSON or event-stream answers.

Kept apart from `endpoint` (what a request means) so each reads on its own: keep-alive, the
body size cap, SSE as chunked transfer (a stream's head and first events in one write), and a
listener that remembers its connections so the endpoint's exit can close them.
"""

from __future__ import annotations

import http.client
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Iterable
from http import HTTPStatus
from http.client import HTTPMessage
from http.server import BaseHTTPRequestHandler
from typing import Any


from agents.harness.calls import CallError
from agents.llm.backends.abstract import decode_body, encode_answer

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024  # a whole conversation with long tool outputs fits
MALFORMED = "Malformed header line"


def read_headers(rfile: Any) -> HTTPMessage | str:
    """A request's header block as `http.client.parse_headers` returns it (an `HTTPMessage`, each
    value as the email package's compat32 policy parses it), or why it is refused (a line over
    the stdlib's length limit, more headers than its count limit, a line that is no header)."""
    fields: list[list[str]] = []
    while True:
        line = rfile.readline(http.client._MAXLINE + 1)
        if len(line) > http.client._MAXLINE:
            return "Line too long"
        if line in (b"\r\n", b"\n", b""):
            break
        text = line.decode("iso-8859-1")
        if text[0] in " \t" and fields:  # an obsolete folded line: part of the previous value
            fields[-1].append(text)
            continue
        if ":" not in text:
            return MALFORMED
        fields.append([text])
        if len(fields) > http.client._MAXHEADERS:
            return "Too many headers"
    message = HTTPMessage()
    for lines in fields:
        name, value = lines[0].split(":", 1)
        message[name] = (value.lstrip(" \t") + "".join(lines[1:])).rstrip("\r\n")
    return message


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
        """The request line and headers. An HTTP/1.x request's headers are read here without the
        `email` package (the stdlib's parse was ~40 µs of a call's ~1 ms in the endpoint);
        anything else takes the stdlib's path, with its errors."""
        self.received = time.monotonic()  # the request line is in: a call's TTFT counts from here
        words = self.raw_requestline.rstrip(b"\r\n").split()
        if len(words) != 3 or words[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
            return super().parse_request()
        self.requestline = self.raw_requestline.rstrip(b"\r\n").decode("iso-8859-1")
        self.command, self.path, self.request_version = (w.decode("iso-8859-1") for w in words)
        if self.path.startswith("//"):
            self.path = "/" + self.path.lstrip("/")  # as the stdlib does
        headers = read_headers(self.rfile)
        if isinstance(headers, str):
            self.close_connection = True
            malformed = headers == MALFORMED
            self.send_error(
                HTTPStatus.BAD_REQUEST if malformed else HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, headers
            )
            return False
        self.headers = headers
        connection = headers.get("Connection", "").lower()
        self.close_connection = connection == "close" or (
            self.request_version != "HTTP/1.1" and connection != "keep-alive"
        )
        if headers.get("Expect", "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

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
        data = encode_answer(body)
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
        self._headers_buffer.append(b"\r\n" + _chunk("".join(events).encode()))  # no events: the head alone
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

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The Date header's text, formatted once a second (it names the second)."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        now = int(time.time())
        second, text = self.server.date
        if second != now:
            text = super().date_time_string(now)
            self.server.date = (now, text)  # one tuple: a racing connection sees a whole pair
        return text

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
        self.date: tuple[int, str] = (0, "")  # the second and its Date header text (`Handler`)
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
