"""One HTTP client per process for the inference servers: a connection pool every session shares.

Building an `httpx.Client` costs ~20 ms of CPU (its SSL context loads the CA bundle), and one
per LLM session was a fifth of a RUN worker's time; a client per session also opened a new
connection for every turn. Here one client per process keeps up to `slots` idle keep-alive
connections (each slot has at most one request in flight; the stage worker calls
`configure(concurrency)` at start) and never caps the open ones, so a request never queues for
a connection behind another server's.

Safe to share between jobs and tenants:
- a credential is a header of its own request (`GenerateRequest.headers`), never a client
  default, and redirects are not followed, so it goes only to the URL it was meant for;
- cookies are never stored (a server's Set-Cookie would otherwise reach every later request
  to that host, whoever's job made it);
- aborting one request (`abort.py`) shuts down only the connection that request is using.

Generation calls (`ServerClient.call`, `.stream`) skip httpx's request and response objects
(~0.5 ms of CPU per call at 32 threads: 2.03 ms against 1.52; docs/benchmarks-history.md, "Hot
path, round 4") and httpcore's pool and h11 (~0.45 ms more than a raw socket): `http11.py`
writes the request and parses the answer with httptools over the same backends' streams. The
rules above hold the same way there: no cookie jar at all, no redirects, the credential a
header of its own request, the URL guard and the abort handle on the same network backends.
Everything else (health probes, model lists, weight pushes) goes through the httpx client,
whose transport sends over the same per-server connections.

Across fork the child forgets the parent's client (its sockets belong to the parent) and
builds its own on first use; the client is closed at exit. The SSL context honours
SSL_CERT_FILE / SSL_CERT_DIR as httpx does; proxy variables (HTTP_PROXY...) are not used for
inference servers, which are reached directly.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpcore
import httpx

from agents.llm.backends.abort import RecordingBackend
from agents.llm.backends.http11 import Exchange, Lane, request_bytes
from agents.llm.backends.guard import GuardedBackend, check_request, connecting, current_rules

DEFAULT_SLOTS = 16  # library use, where no worker said how many sessions run at once
KEEPALIVE_EXPIRY_SECONDS = 30.0
USER_AGENT = b"raas"

# What `send` raises when the server could not be reached or answered no HTTP: httpcore's
# transport errors, and httpx's (the URL guard's `UrlRefused` is an httpx ConnectError).
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    httpcore.NetworkError,
    httpcore.TimeoutException,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    httpcore.ConnectionNotAvailable,
    httpx.HTTPError,
)

_lock = threading.Lock()
_client: ServerClient | None = None
_slots = DEFAULT_SLOTS


@dataclass(frozen=True)
class Reply:
    """A server's answer to `send`: the status and the whole body, read."""

    status: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class _AbortableTransport(httpx.BaseTransport):
    """httpx's transport over `http11` lanes whose connections report their sockets to the
    abort handle of the thread using them (`abort.RecordingBackend`).

    One lane (idle connections) per server origin, so a request never waits behind another
    server's, and one set of connections for both ways in: `send` / `stream` (generation
    calls, without httpx's objects) and `handle_request` (httpx's client: probes, model
    lists, weight pushes).

    A call inside `guard.url_guard(rules)` (a tenant's URL) is checked against the rules and
    sent over a lane of its own whose connections go only to addresses the rules allow."""

    def __init__(self, slots: int) -> None:
        self._slots = slots
        self._ssl_context = httpx.create_ssl_context()
        self._lanes: dict[tuple[str, bool], Lane] = {}
        self._lanes_lock = threading.Lock()

    def _lane(self, origin: str, guarded: bool) -> Lane:
        """The lane for `origin` (`scheme://host:port`), built on first use."""
        key = (origin.lower(), guarded)
        lane = self._lanes.get(key)
        if lane is None:
            with self._lanes_lock:
                lane = self._lanes.get(key)
                if lane is None:
                    parts = urllib.parse.urlsplit(origin)
                    if parts.scheme not in ("http", "https") or not parts.hostname:
                        raise httpcore.UnsupportedProtocol(f"{origin}: not an http:// or https:// server")
                    lane = Lane(
                        parts.scheme,
                        parts.hostname,
                        parts.port or (443 if parts.scheme == "https" else 80),
                        GuardedBackend(RecordingBackend()) if guarded else RecordingBackend(),
                        self._ssl_context,
                        self._slots,
                        KEEPALIVE_EXPIRY_SECONDS,
                    )
                    self._lanes[key] = lane
        return lane

    def _open(
        self, url: str, request: bytes, timeout: float, httpx_url: httpx.URL | None = None, bodiless: bool = False
    ) -> Exchange:
        """Send `request` to `url`'s server, guarded when this thread is; its response's head."""
        scheme, _, authority = url.split("/", 3)[:3]
        origin = f"{scheme}//{authority}"
        rules = current_rules()
        if rules is None:
            return self._lane(origin, False).open(request, timeout, bodiless)
        target = check_request(rules, httpx_url or httpx.URL(url))
        with connecting(rules, target):
            return self._lane(origin, True).open(request, timeout, bodiless)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout") or {}
        timeout = max((t for t in timeouts.values() if t is not None), default=None)
        body = request.read()
        fields = [(k, v) for k, v in request.headers.raw if k.lower() not in (b"content-length", b"transfer-encoding")]
        method = request.method
        wire = request_bytes(
            method, request.url.raw_path.decode("ascii"), fields, body if body or method in BODY_METHODS else None
        )
        with _httpx_errors():
            answer = self._open(str(request.url), wire, timeout, request.url, method == "HEAD")
        return httpx.Response(
            answer.status,
            headers=answer.headers,
            stream=_ResponseStream(answer),
            extensions={"http_version": b"HTTP/1.1"},
        )

    def send(self, method: str, url: str, body: bytes | None, timeout: float, headers: dict[str, str] | None) -> Reply:
        """One request on the lanes themselves (see the module's docstring), guarded as
        `handle_request` is; raises one of TRANSPORT_ERRORS when no HTTP answer came."""
        with self.stream(method, url, body, timeout, headers) as (status, chunks):
            return Reply(status, b"".join(chunks))

    @contextlib.contextmanager
    def stream(
        self, method: str, url: str, body: bytes | None, timeout: float, headers: dict[str, str] | None
    ) -> Iterator[tuple[int, Iterator[bytes]]]:
        """As `send`, with the body read as it arrives: (status, the body's byte chunks).
        `timeout` bounds each read, not the whole answer (a streamed generation is long)."""
        scheme, _, authority = url.split("/", 3)[:3]
        # Host as the URL writes it (an IPv6 address keeps its brackets).
        fields = [(b"Host", authority.encode()), (b"User-Agent", USER_AGENT), (b"Accept", b"application/json")]
        if body is not None:
            fields.append((b"Content-Type", b"application/json"))
        fields += [(name.encode(), value.encode()) for name, value in (headers or {}).items()]
        target = url[len(scheme) + 2 + len(authority) :] or "/"
        answer = self._open(url, request_bytes(method, target, fields, body), timeout)
        try:
            yield answer.status, answer.chunks()
        finally:
            answer.close()

    def close(self) -> None:
        with self._lanes_lock:
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.close()


BODY_METHODS = ("POST", "PUT", "PATCH")


class _ResponseStream(httpx.SyncByteStream):
    """An `http11.Exchange`'s body as httpx reads it (httpcore's errors as httpx's)."""

    def __init__(self, answer: Exchange) -> None:
        self._answer = answer

    def __iter__(self) -> Iterator[bytes]:
        with _httpx_errors():
            yield from self._answer.chunks()

    def close(self) -> None:
        self._answer.close()


@contextlib.contextmanager
def _httpx_errors() -> Iterator[None]:
    """httpcore's errors as httpx's (what httpx's own transport raises): httpx names each of
    httpcore's exception classes the same, so the most specific class of the error that httpx
    also has is the one raised."""
    try:
        yield
    except Exception as exc:
        for cls in type(exc).__mro__:
            mapped = getattr(httpx, cls.__name__, None) if cls.__module__.startswith("httpcore") else None
            if isinstance(mapped, type) and issubclass(mapped, httpx.TransportError):
                raise mapped(str(exc)) from exc
        raise


class ServerClient(httpx.Client):
    """httpx's client over the pools above, with `call` going to the pools directly."""

    def __init__(self, slots: int) -> None:
        self._pools = _AbortableTransport(slots)
        no_cookies = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
        super().__init__(transport=self._pools, cookies=no_cookies, follow_redirects=False, trust_env=False)

    def call(
        self, method: str, url: str, body: bytes | None, timeout: float, headers: dict[str, str] | None = None
    ) -> Reply:
        """One call (a generation, a health probe): JSON `body` bytes in, the status and the
        body out; no HTTP answer raises one of TRANSPORT_ERRORS."""
        return self._pools.send(method, url, body, timeout, headers)

    def stream(
        self, method: str, url: str, body: bytes | None, timeout: float, headers: dict[str, str] | None = None
    ) -> contextlib.AbstractContextManager[tuple[int, Iterator[bytes]]]:
        """A call whose body is read as it arrives (a streamed generation): a context of
        (status, the body's byte chunks); the connection goes back to the pool at its exit."""
        return self._pools.stream(method, url, body, timeout, headers)


def make_client(slots: int = DEFAULT_SLOTS) -> ServerClient:
    """A new client with the sharing rules above (tests; the process uses `shared_client`)."""
    return ServerClient(slots)


def shared_client() -> ServerClient:
    """This process's client for inference servers (built on first use)."""
    global _client
    with _lock:
        if _client is None:
            _client = make_client(_slots)
        return _client


def configure(slots: int) -> None:
    """Size the pool for `slots` concurrent sessions (the worker's concurrency); a client
    already built with another size is replaced (its connections close when idle)."""
    global _slots, _client
    if slots < 1:
        raise ValueError(f"slots must be at least 1, not {slots}")
    with _lock:
        if slots != _slots and _client is not None:
            _client.close()
            _client = None
        _slots = slots


def close() -> None:
    """Close this process's client (at exit; the next use builds a new one)."""
    global _client
    with _lock:
        client, _client = _client, None
    if client is not None:
        client.close()


def _forget_after_fork() -> None:
    """In a forked child: drop the parent's client without closing the parent's sockets."""
    global _client, _lock
    _lock = threading.Lock()
    _client = None


atexit.register(close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
