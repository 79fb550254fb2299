"""Aborting a generation in flight: close its connection so the server stops decoding.

vLLM and SGLang abort a request whose client disconnects. Closing an httpx client from
another thread does not wake a thread blocked reading the answer, but shutting the socket down
does, so the handle records the socket of each connection the request opens (httpcore's trace
hook) and `abort()` shuts them down. Requests made under a handle ask for `Connection: close`
so every call opens (and records) its own connection.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, Iterator

POLL_SECONDS = 0.25


class AbortHandle:
    """The connections of one generation call, and a way to cut them from another thread."""

    def __init__(self) -> None:
        self._sockets: list[Any] = []
        self._lock = threading.Lock()
        self.aborted = False

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore trace hook: remember each new connection's socket."""
        if event == "connection.connect_tcp.complete":
            sock = info["return_value"].get_extra_info("socket")
            with self._lock:
                self._sockets.append(sock)
                if self.aborted:
                    _shutdown(sock)

    def abort(self) -> None:
        """Shut down every connection of the call (idempotent)."""
        with self._lock:
            self.aborted = True
            for sock in self._sockets:
                _shutdown(sock)


def _shutdown(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


@contextmanager
def abort_when(cancelled: Callable[[], bool] | None) -> Iterator[AbortHandle | None]:
    """A handle that a watcher thread aborts once `cancelled()` turns true (until exit)."""
    if cancelled is None:
        yield None
        return
    handle, done = AbortHandle(), threading.Event()

    def watch() -> None:
        while not done.wait(POLL_SECONDS):
            if cancelled():
                handle.abort()
                return

    watcher = threading.Thread(target=watch, name="raas-abort-watch", daemon=True)
    watcher.start()
    try:
        yield handle
    finally:
        done.set()
        watcher.join()
