"""One rollout's conversation with the policy: a token-exact trajectory on a sticky server.

The agent loop drives it: `start(messages, tools)` renders the prompt, `generate(deadline)`
samples one turn, `append_messages(observations)` adds the template delta, and at the end
`trajectory()` and `audit_drift()` give what is stored on the rollout. The session holds one
in-flight slot on one server for its whole life (released by `close()`) and moves to another
server only when its server fails or leaves the pool.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from agents.llm.backends import GenerateRequest, Generation, ServerError, get_backend_class
from agents.llm.backends.abort import abort_when
from agents.llm.pool import ServerInfo, ServerPool, make_pool
from agents.llm.spec import LLMSpec, SamplingParams, parse_model
from agents.llm.tokenizer import load_chat_tokenizer, list_models, resolve_tokenizer_path
from agents.llm.trajectory import Trajectory, TrajectoryBuilder
from app.errors import RolloutCancelled, ServiceUnavailable, StageTimeout

log = logging.getLogger(__name__)

NO_SERVER_RETRY_SECONDS = 0.5
# When every server is down, keep trying this long (within the deadline) before giving up.
NO_SERVER_WAIT_SECONDS = 30.0
_model_names: dict[str, str | None] = {}


class LLMSession:
    """One rollout's conversation with the policy: token-exact trajectory + sticky server."""

    def __init__(self, spec: LLMSpec, sampling: SamplingParams, rollout_id: str,
                 pool: ServerPool, builder: TrajectoryBuilder) -> None:
        self.spec = spec
        self.sampling = sampling
        self.rollout_id = rollout_id
        self.pool = pool
        self.builder = builder
        api_key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
        self.backend = get_backend_class(spec.backend)(api_key=api_key)
        self.server: ServerInfo | None = None
        self._stuck_url: str | None = None
        self.closed = False

    @classmethod
    def open(cls, llm_spec: dict, sampling: dict, rollout_id: str, db_url: str) -> LLMSession:
        """A session for `rollout_id` from the job's (normalised) llm spec and sampling dict."""
        spec: LLMSpec = parse_model(LLMSpec, llm_spec, "llm")
        params: SamplingParams = parse_model(SamplingParams, sampling, "sampling")
        if spec.tokenizer is None:
            spec.tokenizer = resolve_tokenizer_path(spec, db_url)
        tokenizer = load_chat_tokenizer(spec.tokenizer, spec.chat_template)
        if not spec.token_exact:
            log.warning("rollout %s uses the text-only %s backend: trajectory NOT token-exact",
                        rollout_id, spec.backend)
        builder = TrajectoryBuilder(tokenizer, spec.max_model_len, spec.chat_template_kwargs,
                                    token_exact=spec.token_exact)
        return cls(spec, params, rollout_id, make_pool(spec.model_dump(), db_url), builder)

    def __enter__(self) -> LLMSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, messages: list[dict], tools: list[dict] | None = None) -> None:
        """Render the prompt (system + user) through the chat template, with the tool schemas."""
        self.builder.start(messages, tools)

    @property
    def supports_tools(self) -> bool:
        """True when the chat template renders tool schemas itself (else describe them in text)."""
        return self.builder.tok.supports_tools

    @property
    def budget_left(self) -> int:
        """Tokens left before max_model_len."""
        return self.builder.budget_left

    def generate(self, deadline: float,
                 cancelled: Callable[[], bool] | None = None) -> Generation:
        """Sample one turn before `deadline` (time.monotonic()), failing over between servers.

        When `cancelled()` turns true mid-call the request's connection is closed (the server
        stops decoding) and RolloutCancelled is raised instead of waiting for the turn.
        """
        budget = self.builder.budget_left
        if budget <= 0:
            self.builder.trajectory().finish_reason = "length"
            return Generation(token_ids=[], logprobs=[], finish_reason="length")
        tried: set[str] = set()
        while True:
            server = self._server_for_turn(deadline, tried)
            request = self._request(server, min(self.sampling.max_tokens, budget), deadline)
            try:
                with abort_when(cancelled) as handle:
                    self.backend.abort_handle = handle
                    try:
                        generation = self.backend.generate(server.url, request)
                    finally:
                        self.backend.abort_handle = None
            except ServerError as exc:
                if handle is not None and handle.aborted:
                    raise RolloutCancelled("rollout cancelled during generation",
                                           rollout_id=self.rollout_id) from exc
                if time.monotonic() >= deadline:
                    raise StageTimeout(f"generation passed its deadline on {server.url}") from exc
                self._fail_over(server, str(exc))
                tried.add(server.url)
                continue
            return self._record(generation, server)

    def _request(self, server: ServerInfo, max_tokens: int, deadline: float) -> GenerateRequest:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StageTimeout(f"rollout {self.rollout_id}: LLM deadline passed")
        traj = self.builder.trajectory()
        return GenerateRequest(
            prompt_ids=traj.prompt_ids + traj.response_ids,
            max_tokens=max_tokens,
            sampling=self.sampling.model_dump(),
            timeout=min(self.spec.request_timeout, remaining),
            model=server.model or _served_model(server.url),
            messages=traj.messages,
            tools=self.builder.tools,
        )

    def _record(self, generation: Generation, server: ServerInfo) -> Generation:
        """Append the turn to the trajectory and stamp it with server and weight version."""
        if not self.backend.token_exact:
            generation = self._tokenize_text_answer(generation)
        generation.server = server.url
        generation.weight_version = server.weight_version
        generation.text = self.builder.add_generation(
            generation.token_ids, generation.logprobs, generation.finish_reason,
            server.weight_version)
        return generation

    def _tokenize_text_answer(self, generation: Generation) -> Generation:
        """Text-only backends: re-tokenize the answer (inexact) and close it with an end token."""
        tok = self.builder.tok
        ids = tok.encode(generation.text)
        if generation.finish_reason == "stop" and tok.hf.eos_token_id is not None:
            ids.append(tok.hf.eos_token_id)
        generation.token_ids, generation.logprobs = ids, [0.0] * len(ids)
        return generation

    def _server_for_turn(self, deadline: float, tried: set[str]) -> ServerInfo:
        """The sticky server (re-read: weight version may change), else a fresh pick."""
        if self.server is not None:
            current = self.pool.lookup(self.server.url)
            if current is not None:
                self.server = current
                return current
            log.info("rollout %s: server %s left the pool", self.rollout_id, self.server.url)
            self.pool.release(self.server.url)
            self.server = None
        if not tried:
            sticky = self.pool.sticky_url(self.rollout_id)
            self.server = self.pool.take(sticky) if sticky else None
        if self.server is None:
            self.server = self._acquire(deadline, tried)
        if self._stuck_url != self.server.url:
            self.pool.stick(self.rollout_id, self.server.url)
            self._stuck_url = self.server.url
        return self.server

    def _acquire(self, deadline: float, tried: set[str]) -> ServerInfo:
        """Pick a server, waiting (bounded by the deadline) while none is healthy."""
        give_up = min(deadline, time.monotonic() + NO_SERVER_WAIT_SECONDS)
        while True:
            try:
                return self.pool.acquire(exclude=frozenset(tried))
            except ServiceUnavailable as exc:
                if time.monotonic() + NO_SERVER_RETRY_SECONDS >= give_up:
                    raise ServiceUnavailable(f"rollout {self.rollout_id}: {exc.message}") from exc
                tried.clear()  # the pool skips servers marked down until they probe healthy
                time.sleep(NO_SERVER_RETRY_SECONDS)

    def _fail_over(self, server: ServerInfo, error: str) -> None:
        log.warning("rollout %s: LLM server %s failed, moving on: %s",
                    self.rollout_id, server.url, error)
        self.pool.mark_down(server.url, error)
        self.pool.release(server.url)
        self.server = None

    def append_messages(self, messages: list[dict]) -> list[int]:
        """Add tool observations / user turns as the template delta (mask 0); returns its ids."""
        return self.builder.add_messages(messages)

    def trajectory(self) -> Trajectory:
        """The trajectory so far."""
        return self.builder.trajectory()

    def audit_drift(self) -> dict[str, Any]:
        """{"retokenization_drift": n_positions, "first_diff": idx|None} vs a full re-render."""
        return self.builder.audit_drift()

    def close(self) -> None:
        """Release the in-flight slot (idempotent)."""
        if not self.closed and self.server is not None:
            self.pool.release(self.server.url)
        self.server = None
        self.closed = True


def _served_model(url: str) -> str | None:
    """The first model a server lists (cached); vLLM rejects requests naming another one."""
    if url not in _model_names:
        models = list_models(url)
        _model_names[url] = models[0].get("id") if models else None
    return _model_names[url]
