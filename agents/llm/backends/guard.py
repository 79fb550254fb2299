"""The operator's URL rules, enforced where a tenant's inference-server URL is connected to.

Checking a URL when it is submitted is not enough: a DNS name allowed because it resolved
into an allowed range could be pointed elsewhere afterwards (DNS rebinding). Code that calls a
tenant's URL runs inside `url_guard(rules)`; the shared client (`http_client.py`) then
- refuses a request whose scheme, host, port or path no rule allows (`UrlRefused`, an httpx
  ConnectError: the caller's usual network-error path, and nothing was sent);
- opens the request's connection from a pool of its own, resolving the name itself and
  connecting to an address a rule allows (never to what the name says a moment later);
- follows no redirects (the client never does).
`url_guard(None)` (an operator's URL) leaves the request to the ordinary pool. The guard is
per thread: a thread started inside a guarded block is not guarded (LLMSession enters it
around each call itself).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

from core.urls import Target, UrlRule, address_allowed, parse_url, resolve

_state = threading.local()  # .rules: the guard of this thread; .target: the request's URL


class UrlRefused(httpx.ConnectError):
    """A tenant's URL that the operator's rules do not allow; nothing was sent."""


@contextmanager
def url_guard(rules: list[UrlRule] | None) -> Iterator[None]:
    """Calls in this block go only where `rules` allow (None: anywhere, an operator's URL)."""
    previous = getattr(_state, "rules", None)
    _state.rules = rules
    try:
        yield
    finally:
        _state.rules = previous


def current_rules() -> list[UrlRule] | None:
    """The rules this thread's calls are held to, if any."""
    return getattr(_state, "rules", None)


def check_request(rules: list[UrlRule], url: httpx.URL) -> Target:
    """The request's target when some rule allows its scheme, port and path and could allow
    its host (a name that only a range allows is judged at connection time)."""
    try:
        target = parse_url(str(url.copy_with(query=None, fragment=None)))
    except ValueError as exc:
        raise UrlRefused(f"{url}: {exc}") from None
    for rule in rules:
        if not rule.allows_location(target):
            continue
        if target.address is not None and rule.allows_address(target.address):
            return target
        if target.address is None and (rule.allows_name(target.host) or rule.network):
            return target
    raise UrlRefused(
        f"{target.scheme}://{target.origin}{target.path}: not allowed by the "
        "operator's URL rules (policy.llm.server_urls)"
    )


@contextmanager
def connecting(rules: list[UrlRule], target: Target) -> Iterator[None]:
    """The connection opened in this block is for `target` under `rules`."""
    _state.connect = (rules, target)
    try:
        yield
    finally:
        _state.connect = None


class GuardedBackend(httpcore.NetworkBackend):
    """Resolves the host itself and connects only to an address the rules allow."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        rules, target = getattr(_state, "connect", None) or (None, None)
        if rules is None or target is None or target.host != host.lower().strip("[]") or target.port != port:
            raise httpcore.ConnectError(f"{host}:{port}: a guarded connection without its URL")
        allowed = [
            a
            for a in ([target.address] if target.address else resolve(host, port))
            if address_allowed(rules, target, a)
        ]
        if not allowed:
            raise httpcore.ConnectError(f"{host}:{port} resolves to no address the operator's URL rules allow")
        return self._inner.connect_tcp(
            str(allowed[0]), port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("guarded calls never use unix sockets")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)
