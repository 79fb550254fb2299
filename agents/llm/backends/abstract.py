"""The LLMBackend interface: one generation call against one server, and the registry by name.

A backend only speaks a wire protocol; choosing the server, failover and the trajectory live in
the pool and the session. `ServerError` means "this server failed, try another one";
anything the request itself got wrong is an InvalidRequest and is not retried elsewhere.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, ClassVar, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from agents.llm.backends import http_client
from core.errors import InvalidRequest, ServiceUnavailable
from core.registry import Registry, RegistryError, config_type, config_union

log = logging.getLogger(__name__)


class ServerError(ServiceUnavailable):
    """The server could not answer (connection, timeout, 5xx, garbage); fail over."""


# What a server does when the job sets nothing: sample the whole distribution (top_k -1: off).
NEUTRAL_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


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
    stop: list[str] = field(default_factory=list)  # this call's own stop strings (a harness's)
    headers: dict[str, str] = field(default_factory=dict)  # the server's credential, if any
    # Streamed generation: called with each piece of new text as the server sends it (a
    # backend that cannot stream calls it once with the whole text). The ids and logprobs of
    # the Generation are the server's either way.
    on_delta: Callable[[str], None] | None = None
    # Called once the server has accepted the streamed request (its 200, before any token):
    # the harness endpoint sends its own reply's head then, off the first token's path.
    on_open: Callable[[], None] | None = None

    def sampling_params(self, *names: str) -> dict[str, Any]:
        """The named sampling parameters under the names vLLM, SGLang and OpenAI share: the
        job's value, else the neutral one (`NEUTRAL_SAMPLING`)."""
        return {name: self.sampling.get(name, NEUTRAL_SAMPLING[name]) for name in names}

    def stop_strings(self) -> list[str]:
        """The job's stop strings, then the call's own (a harness's `stop`), each once."""
        return list(dict.fromkeys([*(self.sampling.get("stop") or []), *self.stop]))

    def stop_and_seed(self) -> dict[str, Any]:
        """`stop` and `seed` where set (vLLM's and OpenAI's names)."""
        out: dict[str, Any] = {"stop": self.stop_strings()} if self.stop_strings() else {}
        if self.sampling.get("seed") is not None:
            out["seed"] = self.sampling["seed"]
        return out


class DeltaSink(Protocol):
    """Where a streamed turn's text goes (the harness endpoint's reply in progress)."""

    def delta(self, text: str) -> None:
        """New text, as the server sent it."""

    def restart(self) -> None:
        """The request is asked again (failover, abort): its text starts over."""

    def opened(self) -> None:
        """A server accepted the streamed request (called before its first text; optional)."""


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
    paused_seconds: float = 0.0  # waited on a paused pool (weight push): not the agent's time
    # What stopped it, as vLLM says: the stop string matched (its text is cut from the server's
    # text, never from `token_ids`: the ids that made it are kept), a stop token id, or None.
    stop_reason: str | int | None = None


class BackendConfig(BaseModel):
    """The config a job chooses a backend with. Each backend declares a subclass as its
    `Config`, whose `type` is a one-value Literal: the name it is registered under."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str


class LLMBackend(ABC):
    """A wire protocol to an inference server."""

    Config: ClassVar[type[BackendConfig]]
    name: ClassVar[str]  # set by `register_backend` from `Config`'s `type`
    token_exact: ClassVar[bool] = True
    streams: ClassVar[bool] = False  # honours `GenerateRequest.on_delta` (else never calls it)

    @abstractmethod
    def generate(self, url: str, request: GenerateRequest) -> Generation:
        """Run one generation on the server at `url` (token ids and logprobs filled in)."""

    def health(self, url: str, timeout: float = 5.0) -> None:
        """Raise ServerError unless the server answers its health endpoint."""
        self._call("GET", f"{url}/health", None, timeout)

    def _call(
        self, method: str, url: str, body: dict | None, timeout: float, headers: dict[str, str] | None = None
    ) -> Any:
        """One HTTP call; network trouble and 5xx are ServerError, 4xx InvalidRequest.

        Errors carry the status and its standard reason only: the body came from a server the
        job pointed at and is never echoed into results (it is logged here, truncated)."""
        content = None if body is None else encode_body(body)
        try:
            response = http_client.shared_client().call(method, url, content, timeout, headers)
        except http_client.TRANSPORT_ERRORS as exc:
            raise ServerError(f"{url}: {type(exc).__name__}", url=url) from exc
        if response.status >= 400:
            log.warning("%s answered HTTP %s: %.300s", url, response.status, response.text)
        if response.status >= 500 or response.status in (404, 408, 429):
            raise ServerError(f"{url}: {http_summary(response.status)}", url=url)
        if response.status >= 400:
            error = InvalidRequest(f"{url}: {http_summary(response.status)}", url=url)
            error.server_text = response.text[:2000]  # for server_said(); never in results
            raise error
        try:
            return decode_body(response.content) if response.content else {}
        except ValueError as exc:
            raise ServerError(f"{url}: response is not JSON", url=url) from exc

    def _stream(
        self,
        url: str,
        body: dict,
        timeout: float,
        headers: dict[str, str] | None = None,
        on_open: Callable[[], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """A POST answered with server-sent events: each `data:` payload as JSON, up to
        `[DONE]` (`on_open` called once the server accepted it). Errors as `_call`'s; an
        error event mid-stream is a ServerError."""
        try:
            with http_client.shared_client().stream("POST", url, encode_body(body), timeout, headers) as (
                status,
                chunks,
            ):
                if status >= 400:
                    self._check_status(url, status, b"".join(chunks))
                if on_open is not None:
                    on_open()
                yield from _sse_payloads(url, chunks)
        except http_client.TRANSPORT_ERRORS as exc:
            raise ServerError(f"{url}: {type(exc).__name__}", url=url) from exc

    def _check_status(self, url: str, status: int, content: bytes) -> None:
        """Raise for an HTTP error status as `_call` does."""
        text = content.decode("utf-8", "replace")
        log.warning("%s answered HTTP %s: %.300s", url, status, text)
        if status >= 500 or status in (404, 408, 429):
            raise ServerError(f"{url}: {http_summary(status)}", url=url)
        error = InvalidRequest(f"{url}: {http_summary(status)}", url=url)
        error.server_text = text[:2000]  # for server_said(); never in results
        raise error


def _sse_payloads(url: str, chunks: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON `data:` payloads of an SSE body, as they arrive, until `[DONE]`."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        while True:
            cut = pending.find(b"\n\n")
            if cut < 0:
                break
            event, pending = pending[:cut], pending[cut + 2 :]
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                try:
                    payload = decode_body(data)
                except ValueError as exc:
                    raise ServerError(f"{url}: a streamed event is not JSON", url=url) from exc
                if isinstance(payload, dict) and payload.get("error") is not None:
                    log.warning("%s failed mid-stream: %.300s", url, payload["error"])
                    raise ServerError(f"{url}: the server failed the generation mid-stream", url=url)
                yield payload
    raise ServerError(f"{url}: the stream ended before [DONE]", url=url)


# vLLM's OpenAI server answers a token's -inf logprob as this floor (`max(logprob, -9999.0)`).
LOGPROB_FLOOR = -9999.0


def finite_logprobs(values: Any) -> list[float]:
    """Each logprob as a float, a non-finite one (-inf, NaN: the simulator, another server)
    as LOGPROB_FLOOR, as vLLM sends it: a trajectory's logprobs are always numbers a trainer
    can put in a tensor and JSON can store (PostgreSQL's JSONB refuses -Infinity)."""
    out = [float(value) for value in values]
    if not all(map(math.isfinite, out)):
        out = [value if math.isfinite(value) else LOGPROB_FLOOR for value in out]
    return out


def encode_body(body: dict) -> bytes:
    """A request body as JSON, with orjson: the stdlib's encode and decode of the generation
    call were ~5 % of a RUN worker's CPU (py-spy, `bench/hot_path.py`). Integer keys
    (`logit_bias`) are written as strings, as `json.dumps` writes them."""
    return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)


def encode_answer(value: Any) -> bytes:
    """An answer's JSON as UTF-8 (the harness endpoint's bodies and stream events): orjson, or
    the stdlib for what orjson cannot write (an integer past 64 bits a model wrote)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False).encode()


def decode_body(content: bytes) -> Any:
    """A response body: orjson, or the stdlib for what orjson refuses and `json` reads
    (NaN, Infinity, lone surrogates), so a server's answer parses as before; ValueError if
    neither. One difference: an integer past 64 bits reads as a float (no field raas reads
    holds one in a real server's answer: token ids are below the vocabulary size)."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return json.loads(content)


def server_said(exc: InvalidRequest) -> str:
    """What the server's 4xx body said (the caller parses it, e.g. a context limit)."""
    return getattr(exc, "server_text", "") or exc.message


def http_summary(status: int) -> str:
    """`HTTP 404 Not Found`: what a result may say about a failed call."""
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


BACKENDS: Registry[type[LLMBackend]] = Registry("LLM backend", "llm.backend")


def register_backend(cls: type[LLMBackend]) -> type[LLMBackend]:
    """Class decorator: register a backend under the name its `Config` declares (`type`);
    a duplicate name raises."""
    cls.name = config_type(cls.Config)
    return BACKENDS.add(cls.name, cls)


def backend_config_union() -> object:
    """The registered backends' configs as one union discriminated on `type`."""
    return config_union([cls.Config for _name, cls in BACKENDS])


@functools.lru_cache(maxsize=8)
def _config_adapter(names: tuple[str, ...]) -> TypeAdapter:
    """The union's validator for these registered backends: building a TypeAdapter generates
    its schema (~1.7 ms), and every stage validates a job config, whose llm spec has a backend.
    A backend registered later changes `names`, so it gets a new adapter."""
    return TypeAdapter(backend_config_union())


def backend_config(value: str | dict) -> BackendConfig:
    """The config of a backend chosen by name (`"vllm"`, as on the wire today) or as a mapping
    with `type`; an unknown name is a RegistryError listing the valid ones."""
    data = {"type": value} if isinstance(value, str) else value
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise RegistryError(f"an LLM backend is a name or a mapping with 'type', not {value!r}", field=BACKENDS.field)
    BACKENDS.get(data["type"])  # unknown: RegistryError naming the valid ones
    try:
        return _config_adapter(tuple(BACKENDS.names())).validate_python(data)
    except ValidationError as exc:
        raise RegistryError(f"bad config for LLM backend {data['type']!r}: {exc}", field=BACKENDS.field) from None


def get_backend_class(name: str) -> type[LLMBackend]:
    """The backend class registered as `name`; an unknown name lists the valid ones."""
    return BACKENDS.get(name)


def backend_names() -> list[str]:
    """Sorted names of the registered backends."""
    return BACKENDS.names()
