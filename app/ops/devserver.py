"""The built-in HTTP server of `raas up` and `raas gateway`, bounded against slow clients.

Werkzeug's threaded server gives every connection a thread and waits for its headers forever:
300 connections that never finish their headers held 300 threads (issue 22.10). Here:
- at most `max_connections` connections are served at once; one more is answered `503` and
  closed at once (no thread is started for it);
- a request's line and headers must arrive within `header_timeout` seconds of the server
  starting to wait for them, however slowly they trickle (a watchdog shuts the socket down);
  an idle keep-alive connection waiting for its next request is closed by the same rule;
- every later read or write of a connection (body, answer) waits at most `idle_timeout`.
The production gateway is gunicorn (`gunicorn 'app:create_app()'`): docs/deployment.md, and
docs/security.md "Production gateway".
"""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any

from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 34\r\n"
    b"Connection: close\r\n\r\ntoo many connections; retry later\n"
)
WATCH_INTERVAL = 0.25
TOKEN_PARAM = re.compile(r"((?:^|&)token=)[^&]*", re.I)


def redact_query(path: str) -> str:
    """`path` with the value of every `token` query parameter replaced by `***`."""
    if "?" not in path:
        return path
    base, _, query = path.partition("?")
    return base + "?" + TOKEN_PARAM.sub(r"\1***", query)


class _BoundedHandler(WSGIRequestHandler):
    """Werkzeug's handler with a header deadline (see the module docstring)."""

    def setup(self) -> None:
        self.timeout = self.server.idle_timeout  # StreamRequestHandler applies it to the socket
        super().setup()

    def handle_one_request(self) -> None:
        self.server.watch(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.unwatch(self.connection)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """The access log line, with `token=` values in the query replaced by `***`."""
        path = getattr(self, "path", None)
        if path is not None:
            self.path = redact_query(path)
        try:
            super().log_request(code, size)
        finally:
            if path is not None:
                self.path = path

    def parse_request(self) -> bool:
        ok = super().parse_request()  # the request line and every header have arrived
        self.server.unwatch(self.connection)
        return ok


class BoundedWSGIServer(ThreadedWSGIServer):
    """A threaded WSGI server with a connection cap and a header deadline."""

    def __init__(
        self, host: str, port: int, app: Any, *, max_connections: int, header_timeout: float, idle_timeout: float
    ) -> None:
        super().__init__(host, port, app, handler=_BoundedHandler)
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self.refused = 0  # connections answered 503 over the cap
        self.timed_out = 0  # connections shut down for headers that never finished
        self._slots = threading.BoundedSemaphore(max_connections)
        self._deadlines: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._watchdog = threading.Thread(target=self._watch_loop, name="raas-header-watchdog", daemon=True)
        self._watchdog.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            try:
                request.settimeout(1.0)
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.unwatch(request)
            self._slots.release()

    def watch(self, sock: socket.socket) -> None:
        """The request line and headers of `sock` must arrive within `header_timeout`."""
        with self._lock:
            self._deadlines[sock] = time.monotonic() + self.header_timeout

    def unwatch(self, sock: socket.socket) -> None:
        """The headers of `sock` arrived (or the connection is over)."""
        with self._lock:
            self._deadlines.pop(sock, None)

    def _watch_loop(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL)
            now = time.monotonic()
            with self._lock:
                late = [s for s, deadline in self._deadlines.items() if deadline < now]
                for sock in late:
                    del self._deadlines[sock]
            for sock in late:
                self.timed_out += 1
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading headers
                except OSError:
                    pass


def make_server(host: str, port: int, app: Any, settings: Any) -> BoundedWSGIServer:
    """The bounded server for `app` with the limits of `settings` (Settings.dev_server)."""
    limits = settings.dev_server
    return BoundedWSGIServer(
        host,
        port,
        app,
        max_connections=limits.max_connections,
        header_timeout=limits.header_timeout,
        idle_timeout=limits.idle_timeout,
    )
