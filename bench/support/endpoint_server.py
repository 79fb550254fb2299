"""A host HTTP server on a sandbox's model endpoint socket, for the bridge's tests and bench.

The rollout endpoint itself (`agents.harness.endpoint`) is what serves there in production;
these stand in for it where only the path through the bridge is under test.
"""

from __future__ import annotations

import os
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from sandbox import bridge


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A threaded HTTP server on a Unix socket."""

    daemon_threads = True

    def get_request(self) -> tuple[Any, tuple[str, int]]:
        """http.server wants a (host, port) client address; a Unix peer has none."""
        request, _ = super().get_request()
        return request, ("local", 0)


def serve_endpoint(sandbox: Any, handler: type[BaseHTTPRequestHandler]) -> UnixHTTPServer:
    """Serve `handler` on the sandbox's endpoint socket from a daemon thread; the socket is
    0666, as the rollout endpoint binds it (the 0700 folder is the guard). End it with
    `shutdown()` and `server_close()`."""
    path = bridge.endpoint_socket(sandbox)
    server = UnixHTTPServer(path, handler)
    os.chmod(path, 0o666)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
