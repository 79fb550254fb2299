"""The LLMBackend interface: one generation call against one server, and the registry by name.

A backend only speaks a wire protocol; choosing the server, failover and the trajectory live in
the pool and the session. `ServerError` means "this server failed, try another one";
anything the request itself got wrong is an InvalidRequest and is not retried elsewhere.
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from core.errors import ConfigError, InvalidRequest, ServiceUnavailable


class ServerError(ServiceUnavailable):
    """The server could not answer (connection, timeout, 5xx, garbage); fail over."""


@dataclass
class GenerateRequest:
    """One turn's request: token backends send `prompt_ids`, chat backends `messages`."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any]
    timeout: float
    model: str | None = None
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None
    stop_token_ids: list[int] = field(default_factory=list)


@dataclass
class Generation:
    """One generated turn, as the server sampled it."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str | None
    text: str = ""  # decoded, for parsing tool calls only; never re-encoded
    server: str | None = None
    weight_version: str | None = None
    logprobs_mode: str | None = None  # what `logprobs` are, as the server declares it
    latency: float = 0.0


class LLMBackend(ABC):
    """A wire protocol to an inference server."""

    name: ClassVar[str]
    token_exact: ClassVar[bool] = True

    def __init__(self, client: httpx.Client | None = None, api_key: str | None = None) -> None:
        self.client = client or httpx.Client()
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.abort_handle: Any = None  # set around a call that may be aborted (abort.py)

    @abstractmethod
    def generate(self, url: str, request: GenerateRequest) -> Generation:
        """Run one generation on the server at `url` (token ids and logprobs filled in)."""

    def health(self, url: str, timeout: float = 5.0) -> None:
        """Raise ServerError unless the server answers its health endpoint."""
        self._call("GET", f"{url}/health", None, timeout)

    def _call(self, method: str, url: str, body: dict | None, timeout: float) -> Any:
        """One HTTP call; network trouble and 5xx are ServerError, 4xx InvalidRequest."""
        headers, extensions = self.headers, {}
        if self.abort_handle is not None:  # own connection, so abort() can cut it
            headers = {**headers, "Connection": "close"}
            extensions = {"trace": self.abort_handle.trace}
        try:
            response = self.client.request(method, url, json=body, timeout=timeout,
                                           headers=headers, extensions=extensions)
        except httpx.HTTPError as exc:
            raise ServerError(f"{url}: {type(exc).__name__}: {exc}", url=url) from exc
        if response.status_code >= 500 or response.status_code in (404, 408, 429):
            raise ServerError(f"{url}: HTTP {response.status_code}: {response.text[:300]}", url=url)
        if response.status_code >= 400:
            raise InvalidRequest(f"{url}: HTTP {response.status_code}: {response.text[:500]}",
                                 url=url)
        try:
            return response.json() if response.content else {}
        except ValueError as exc:
            raise ServerError(f"{url}: response is not JSON", url=url) from exc


_backends: dict[str, type[LLMBackend]] = {}
_lock = threading.Lock()


def register_backend(cls: type[LLMBackend]) -> type[LLMBackend]:
    """Class decorator: register a backend under `cls.name`; a duplicate name raises."""
    with _lock:
        if cls.name in _backends:
            raise ConfigError(f"LLM backend {cls.name!r} is already registered")
        _backends[cls.name] = cls
    return cls


def get_backend_class(name: str) -> type[LLMBackend]:
    """The backend class registered as `name`; an unknown name lists the valid ones."""
    try:
        return _backends[name]
    except KeyError:
        raise ConfigError(
            f"unknown LLM backend {name!r}; valid: {', '.join(sorted(_backends))}"
        ) from None


def backend_names() -> list[str]:
    """Sorted names of the registered backends."""
    return sorted(_backends)
