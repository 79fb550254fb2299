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

Across fork the child forgets the parent's client (its sockets belong to the parent) and
builds its own on first use; the client is closed at exit. The SSL context honours
SSL_CERT_FILE / SSL_CERT_DIR as httpx does; proxy variables (HTTP_PROXY...) are not used for
inference servers, which are reached directly.
"""

from __future__ import annotations

import atexit
import os
import threading
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpcore
import httpx

from agents.llm.backends.abort import RecordingBackend
from agents.llm.backends.guard import GuardedBackend, check_request, connecting, current_rules

DEFAULT_SLOTS = 16  # library use, where no worker said how many sessions run at once
KEEPALIVE_EXPIRY_SECONDS = 30.0

_lock = threading.Lock()
_client: httpx.Client | None = None
_slots = DEFAULT_SLOTS


class _AbortableTransport(httpx.HTTPTransport):
    """httpx's transport over an httpcore pool whose connections report their sockets to the
    abort handle of the thread using them (httpx has no parameter for the network backend).

    A call inside `guard.url_guard(rules)` (a tenant's URL) is checked against the rules and
    sent over a second pool whose connections go only to addresses the rules allow."""

    def __init__(self, slots: int) -> None:
        ssl_context = httpx.create_ssl_context()
        super().__init__(verify=ssl_context)
        self._pool = self._open_pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=None,
            max_keepalive_connections=slots,
            keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
            network_backend=RecordingBackend(),
        )
        self._guarded_pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=None,
            max_keepalive_connections=slots,
            keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
            network_backend=GuardedBackend(RecordingBackend()),
        )
        self._guarded = httpx.HTTPTransport()
        self._guarded._pool = self._guarded_pool

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        rules = current_rules()
        if rules is None:
            return super().handle_request(request)
        target = check_request(rules, request.url)
        with connecting(rules, target):
            return self._guarded.handle_request(request)

    def close(self) -> None:
        super().close()
        self._guarded.close()


def make_client(slots: int = DEFAULT_SLOTS) -> httpx.Client:
    """A new client with the sharing rules above (tests; the process uses `shared_client`)."""
    no_cookies = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
    return httpx.Client(
        transport=_AbortableTransport(slots), cookies=no_cookies, follow_redirects=False, trust_env=False
    )


def shared_client() -> httpx.Client:
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
