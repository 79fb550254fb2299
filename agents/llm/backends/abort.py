"""Aborting a generation in flight: shut its connection down so the server stops decoding.

vLLM and SGLang abort a request whose client disconnects. Closing an httpx client from
another thread does not wake a thread blocked reading the answer, but shutting the socket down
does. The shared client's connections (`http_client.py`) are made by
`RecordingBackend`: a connection written to by a thread inside `abort_when` — a new one or one
reused from the pool — is recorded on that thread's handle and marked as that handle's, and
`abort()` shuts down the connections still marked as its own (one the pool has since lent to
another request is left alone). The pool then discards the dead connection.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Any, Iterator

import httpcore

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25

_current = threading.local()  # .handle: the AbortHandle of this thread's call, if any


class AbortHandle:
    """The connections of one generation call, and a way to cut them from another thread."""

    def __init__(self) -> None:
        self._streams: list[_RecordingStream] = []
        self._lock = threading.Lock()
        self.aborted = False

    def record(self, stream: _RecordingStream) -> None:
        """`stream` carries this call's request now (cut at once if already aborted)."""
        with self._lock:
            stream.owner = self
            if stream not in self._streams:
                self._streams.append(stream)
            if self.aborted:
                stream.shutdown()

    def abort(self) -> None:
        """Shut down every connection this call is still using (idempotent)."""
        with self._lock:
            self.aborted = True
            for stream in self._streams:
                if stream.owner is self:
                    stream.shutdown()

    def finish(self) -> None:
        """The call is over: its connections (idle in the pool now) are no longer its own."""
        with self._lock:
            for stream in self._streams:
                if stream.owner is self:
                    stream.owner = None


class _RecordingStream(httpcore.NetworkStream):
    """A connection's stream that tells the writing thread's abort handle it is in use."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream
        self.owner: AbortHandle | None = None

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        handle = getattr(_current, "handle", None)
        if handle is not None:
            handle.record(self)
        else:
            self.owner = None
        self._stream.write(buffer, timeout)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, timeout)

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _RecordingStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)

    def shutdown(self) -> None:
        """Wake the thread blocked reading: the server sees the client disconnect."""
        sock = self._stream.get_extra_info("socket")
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass


class RecordingBackend(httpcore.NetworkBackend):
    """httpcore's sync network backend, with streams that abort handles can find."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _RecordingStream(
            self._backend.connect_tcp(
                host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
            )
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return _RecordingStream(self._backend.connect_unix_socket(path, timeout=timeout, socket_options=socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _Watcher:
    """One thread per process polls the `cancelled()` of every call in flight (a thread per
    call cost a start and a join per turn)."""

    def __init__(self) -> None:
        self._calls: dict[AbortHandle, Callable[[], bool]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, handle: AbortHandle, cancelled: Callable[[], bool]) -> None:
        with self._lock:
            self._calls[handle] = cancelled
            if self._thread is None or not self._thread.is_alive():  # first use, or forked
                self._thread = threading.Thread(target=self._run, name="raas-abort-watch", daemon=True)
                self._thread.start()

    def remove(self, handle: AbortHandle) -> None:
        with self._lock:
            self._calls.pop(handle, None)

    def _run(self) -> None:
        while True:
            time.sleep(POLL_SECONDS)
            with self._lock:
                calls = list(self._calls.items())
            for handle, cancelled in calls:
                try:
                    if cancelled():
                        handle.abort()
                        self.remove(handle)
                except Exception:  # one call's broken check must not stop the others'
                    log.exception("cancel check failed; the call goes on")


_watcher = _Watcher()


def aborted() -> bool:
    """True when this thread's call (inside `abort_when`) was aborted."""
    handle = getattr(_current, "handle", None)
    return handle is not None and handle.aborted


@contextmanager
def abort_when(cancelled: Callable[[], bool] | None) -> Iterator[AbortHandle | None]:
    """A handle that the watcher aborts once `cancelled()` turns true (checked every
    POLL_SECONDS until exit); requests this thread sends meanwhile through the shared client
    can be cut."""
    if cancelled is None:
        yield None
        return
    handle = AbortHandle()
    _current.handle = handle
    _watcher.add(handle, cancelled)
    try:
        yield handle
    finally:
        _current.handle = None
        _watcher.remove(handle)
        handle.finish()
