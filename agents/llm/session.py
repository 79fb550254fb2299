"""One rollout's conversation with the policy: a token-exact trajectory on a sticky server.

The agent loop drives it: `start(messages, tools)` renders the prompt, `generate(deadline)`
samples one turn, `append_messages(observations)` adds the template delta, and at the end
`trajectory()` and `audit_drift()` give what is stored on the rollout. The session holds one
in-flight slot on one server for its whole life (released by `close()`) and moves to another
server only when its server fails or leaves the pool.

Every request asks for at most what fits: `min(sampling.max_tokens, context left, generated
tokens left)`, where the context is the job's `max_model_len` lowered to what the server reports
in GET /v1/models. The turn's finish reason names the cap that cut it (`turn_length`,
`context`, `token_budget`; see `agents.finish_reasons`). A server the trainer paused (weights
loading) makes the turn wait, never fail; a request vLLM aborted is asked again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from agents.finish_reasons import FinishReason
from agents.llm.backends import GenerateRequest, Generation, ServerError, get_backend_class
from agents.llm.backends.abort import abort_when
from agents.llm.backends.abstract import DeltaSink, server_said
from agents.llm.backends.guard import url_guard
from agents.llm.backends.http11 import while_server_works
from agents.llm.pool import ServerInfo, ServerPool, StaticServerPool
from agents.llm.server_hold import ServerHold
from agents.llm.spec import LLMSpec, SamplingParams, parse_model
from agents.llm.tokenizer import (
    is_context_error,
    load_chat_tokenizer,
    remember_max_model_len,
    served_model,
    stated_context_limit,
    resolve_tokenizer_path,
    server_max_model_len,
)
from agents.llm.trajectory import Trajectory, TrajectoryBuilder
from agents.time_split import SessionClock, expected_generation_seconds
from core.errors import (
    InvalidRequest,
    RolloutCancelled,
    ServiceUnavailable,
    StageTimeout,
)
from core.policy import LLMPolicy, check_credential
from core.urls import UrlRule

log = logging.getLogger(__name__)


class LLMSession(ServerHold):
    """One rollout's conversation with the policy: token-exact trajectory + sticky server
    (which server a turn goes to, and the waits for it: `ServerHold`)."""

    def __init__(
        self,
        spec: LLMSpec,
        sampling: SamplingParams,
        rollout_id: str,
        pool: ServerPool,
        builder: TrajectoryBuilder,
        policy: LLMPolicy | None = None,
        url_rules: list[UrlRule] | None = None,
    ) -> None:
        super().__init__(pool, rollout_id, spec.logprobs_mode)
        self.spec = spec
        self.url_rules = url_rules  # a tenant's job: its servers are held to these
        self.sampling = sampling
        self.builder = builder
        self.policy = policy or LLMPolicy()  # the worker's: where credentials live
        self.backend = get_backend_class(spec.backend)()
        self._modes: set[str | None] = set()
        self.closed = False
        self._stop: list[str] = []  # the running turn's own stop strings
        self._sink: DeltaSink | None = None  # the running turn's streamed text goes here
        # Where the session's time went (`agents.time_split`): the turn's generation so far,
        # and the totals the loop and the harness handler read (they survive a StageTimeout).
        self._generated = 0.0
        self.clock = SessionClock()

    @classmethod
    def open(
        cls,
        llm_spec: LLMSpec | dict,
        sampling: SamplingParams | dict,
        rollout_id: str,
        pool: ServerPool | None = None,
        policy: LLMPolicy | None = None,
        url_rules: list[UrlRule] | None = None,
    ) -> LLMSession:
        """A session for `rollout_id` from the job's (normalised) llm spec and sampling.

        The pipeline passes the job config's typed parts (`JobConfig.llm`, `.sampling`); a
        caller holding plain JSON (a script, a test) may pass dicts, validated here with the
        error naming the field. `pool` is where servers come from (the pipeline's keeps its
        books in the database); without one, the spec's own servers are used with in-process
        bookkeeping. With `url_rules` (a tenant's job) every call to a server goes only where
        they allow.
        """
        spec: LLMSpec = (
            llm_spec.model_copy(deep=True) if isinstance(llm_spec, LLMSpec) else parse_model(LLMSpec, llm_spec, "llm")
        )  # tokenizer is set below
        params: SamplingParams = (
            sampling if isinstance(sampling, SamplingParams) else parse_model(SamplingParams, sampling, "sampling")
        )
        if pool is None:
            pool = StaticServerPool(spec.backend, rollout_id, spec.servers or [], spec.credential)
        if spec.tokenizer is None:
            with url_guard(url_rules):
                spec.tokenizer = resolve_tokenizer_path(spec, pool.candidate_urls)
        tokenizer = load_chat_tokenizer(spec.tokenizer, spec.chat_template_text)
        if not spec.token_exact:
            log.warning(
                "rollout %s uses the text-only %s backend: trajectory NOT token-exact", rollout_id, spec.backend
            )
        builder = TrajectoryBuilder(
            tokenizer, spec.max_model_len, spec.chat_template_kwargs, token_exact=spec.token_exact
        )
        return cls(spec, params, rollout_id, pool, builder, policy, url_rules)

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
        """Tokens left before the effective context length."""
        return self.builder.budget_left

    @property
    def context_length(self) -> int:
        """The effective context: min(job's max_model_len, servers' reported max_model_len)."""
        return self.builder.max_model_len

    @property
    def logprobs_mode(self) -> str | None:
        """What the stored logprobs are (`raw_logprobs` / `processed_logprobs`), once known."""
        modes = {m for m in self._modes if m}
        return modes.pop() if len(modes) == 1 else ("mixed" if modes else None)

    def note_logprobs_mode(self, mode: str | None) -> None:
        """Count a replayed turn's logprobs mode (a resumed RUN, `agents.llm.replay`)."""
        self._modes.add(mode)

    def generate(
        self,
        deadline: float,
        cancelled: Callable[[], bool] | None = None,
        max_new_tokens: int | None = None,
        stop: list[str] | None = None,
        stream: DeltaSink | None = None,
    ) -> Generation:
        """Sample one turn (see `_turn`), under the session's URL rules. `stop`: this turn's
        own stop strings besides the job's (a harness's `stop`): the server stops there and
        the turn keeps every id it sampled (`Generation.stop_reason` names the match).
        `stream`: where the new text goes as the server streams it, when the backend streams
        (`LLMBackend.streams`; else nothing is streamed and the caller has the whole text at
        the end); a request asked again (failover, an aborted or paused request) calls its
        `restart()` first. The Generation is the same streamed or not."""
        self._stop = list(stop or [])
        self._sink = stream if self.backend.streams else None
        with url_guard(self.url_rules):
            return self._turn(deadline, cancelled, max_new_tokens)

    def _turn(
        self, deadline: float, cancelled: Callable[[], bool] | None = None, max_new_tokens: int | None = None
    ) -> Generation:
        """Sample one turn before `deadline` (time.monotonic()), failing over between servers.

        The request asks for at most `sampling.max_tokens`, the context left and
        `max_new_tokens` (what the job's generated-token budget leaves); when nothing is left,
        no request is sent and the generation is empty with that cap as finish reason. When
        `cancelled()` turns true mid-call the request's connection is closed (the server stops
        decoding) and RolloutCancelled is raised instead of waiting for the turn.

        Time spent waiting on a paused pool (a weight push) is not charged: the deadline moves
        on by it, and `Generation.paused_seconds` tells the caller by how much. `clock` adds
        the turn's generation, waiting and paused seconds, whether or not it raised.
        """
        self._deadline, self._cancelled, self._paused, self._generated = deadline, cancelled, 0.0, 0.0
        started = time.monotonic()
        try:
            generation = self._generate(max_new_tokens)
        finally:
            self._report_paused()
            self._clock_turn(time.monotonic() - started)
        generation.paused_seconds = self._paused
        return generation

    def _generate(self, max_new_tokens: int | None) -> Generation:
        """`_turn` once the turn's clock is set."""
        tried: set[str] = set()
        attempts = 0
        while True:
            server = self._server_for_turn(tried)  # marked as generating on it from here
            if attempts and self._sink is not None:
                self._sink.restart()  # a new request: its text starts again
            attempts += 1
            handle, sent, asked = None, time.monotonic(), 0
            try:
                self._fit_context(server)
                cap, reason = self._turn_cap(max_new_tokens)
                if cap <= 0:
                    return self._no_room(reason)
                request = self._request(server, cap, self._deadline)
                request.headers = self._auth_headers(server)
                if self._sink is not None:
                    request.on_delta = self._sink.delta
                    request.on_open = getattr(self._sink, "opened", None)  # optional in a sink
                sent, asked = time.monotonic(), request.max_tokens
                with abort_when(self._cancelled) as handle, while_server_works(self._check_delta):
                    generation = self.backend.generate(server.url, request)
            except _DeltaRedone as redone:
                if redone.error is not None:
                    raise redone.error from None  # the template's, raised here: not taken for the server's
                continue  # the request went out with a delta since redone: ask with the right one
            except ServerError as exc:
                if handle is not None and handle.aborted:
                    raise RolloutCancelled("rollout cancelled during generation", rollout_id=self.rollout_id) from exc
                if time.monotonic() >= self._deadline:
                    self._clock_cut(server, asked, time.monotonic() - sent)
                    raise StageTimeout(f"generation passed its deadline on {server.url}") from exc
                current = self.pool.lookup(server.url)
                if current is not None and current.paused:
                    continue  # paused mid-request (weights loading): wait, then ask again
                self._fail_over(server, str(exc))
                tried.add(server.url)
                continue
            except InvalidRequest as exc:
                said = server_said(exc)  # the body: parsed here, never put in results
                if not is_context_error(said):
                    raise
                if self._learn_context(server, said):
                    continue  # ask again within the limit the server just told us
                return self._no_room(FinishReason.CONTEXT.value)
            finally:
                self.pool.end_generation()
            if not self.builder.check_delta():  # not checked while the server worked (no request went out)
                continue  # generated after a delta since redone: not this trajectory's turn
            if generation.finish_reason == "abort":  # e.g. vLLM paused with in-flight requests
                self._sleep_before(self._deadline, f"{server.url} aborted the request")
                continue
            took = time.monotonic() - sent
            self._generated += min(took, expected_generation_seconds(len(generation.token_ids)))
            return self._record(generation, server, cap, reason)

    def _check_delta(self) -> None:
        """The trajectory's unchecked delta, checked while the server generates (`while_server_works`)."""
        try:
            same = self.builder.check_delta()
        except Exception as exc:  # carried out of the backend call, raised by `_generate`
            raise _DeltaRedone(exc) from exc
        if not same:
            raise _DeltaRedone()

    def _clock_cut(self, server: ServerInfo, asked: int, took: float) -> None:
        """A request the deadline cut: the policy's time up to what a reply of `asked` tokens
        is expected to take, unless the pool was pausing its server (held for a weight push:
        waiting). Whatever is not generation is waiting (`_clock_turn`)."""
        try:
            current = self.pool.lookup(server.url)
        except Exception:  # noqa: BLE001 - the pool's record is away: count it as generation
            current = None
        if current is None or not current.paused:
            self._generated += min(took, expected_generation_seconds(asked))

    def _clock_turn(self, seconds: float) -> None:
        """Add one turn's `seconds` to `clock`: generation, paused, and the rest waiting."""
        self.clock.generation += self._generated
        self.clock.paused += self._paused
        self.clock.waiting += max(0.0, seconds - self._generated - self._paused)

    def _turn_cap(self, max_new_tokens: int | None) -> tuple[int, str]:
        """Most tokens this turn may generate, and the finish reason if that cap cuts it."""
        caps = [(self.builder.budget_left, FinishReason.CONTEXT.value)]
        if max_new_tokens is not None:
            caps.append((max_new_tokens, FinishReason.TOKEN_BUDGET.value))
        caps.append((self.sampling.max_tokens, FinishReason.TURN_LENGTH.value))
        return min(caps, key=lambda c: c[0])  # ties: the cap that ends the episode wins

    def _no_room(self, reason: str) -> Generation:
        """An empty generation: the context is full or the token budget is spent."""
        if reason == FinishReason.CONTEXT.value:
            self.builder.exhausted = True
            self.builder.trajectory().finish_reason = reason
        return Generation(token_ids=[], logprobs=[], finish_reason=reason)

    def _fit_context(self, server: ServerInfo) -> None:
        """Lower the context to what the server reports serving (GET /v1/models)."""
        served = server_max_model_len(server.url)
        if served is not None and served < self.builder.max_model_len:
            log.info(
                "rollout %s: %s serves max_model_len %d < the job's %d",
                self.rollout_id,
                server.url,
                served,
                self.builder.max_model_len,
            )
            self.builder.limit_context(served)

    def _learn_context(self, server: ServerInfo, message: str) -> bool:
        """A context 400 that names the server's limit: lower ours; True if it got lower."""
        log.info("rollout %s: %s rejects the request: %s", self.rollout_id, server.url, message[:300])
        served = stated_context_limit(message)
        if served is None or served >= self.builder.max_model_len:
            return False
        remember_max_model_len(server.url, served)
        self.builder.limit_context(served)
        return True

    def _auth_headers(self, server: ServerInfo) -> dict[str, str]:
        """The server's credential, read from the worker variable the operator registered for
        it and sent only to the URLs the operator allowed (never a variable the job names)."""
        if server.credential is None:
            return {}
        cred = check_credential(self.policy, server.credential, server.url, "credential")
        secret = os.environ.get(cred.env)
        if not secret:
            raise ServiceUnavailable(f"credential {server.credential!r} is not set on this worker")
        return {"Authorization": f"Bearer {secret}"}

    def _request(self, server: ServerInfo, max_tokens: int, deadline: float) -> GenerateRequest:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StageTimeout(f"rollout {self.rollout_id}: LLM deadline passed")
        return GenerateRequest(
            prompt_ids=self.builder.sequence(),  # an unchecked delta is checked once it is sent
            max_tokens=max_tokens,
            sampling=self.sampling.model_dump(),
            timeout=min(self.spec.request_timeout, remaining),
            model=server.model or served_model(server.url),
            messages=self.builder.messages,
            tools=self.builder.tools,
            stop=self._stop,
        )

    def _record(self, generation: Generation, server: ServerInfo, cap: int, cap_reason: str) -> Generation:
        """Append the turn to the trajectory and stamp it with server and weight version."""
        if not self.backend.token_exact:
            generation = self._tokenize_text_answer(generation)
        generation.finish_reason = self._turn_reason(generation, cap, cap_reason)
        generation.server = server.url
        generation.weight_version = server.weight_version
        generation.logprobs_mode = getattr(server, "logprobs_mode", None)
        self._modes.add(generation.logprobs_mode)
        generation.text = self.builder.add_generation(
            generation.token_ids, generation.logprobs, generation.finish_reason, server.weight_version
        )
        return generation

    def _turn_reason(self, generation: Generation, cap: int, cap_reason: str) -> str | None:
        """The server's `length` made precise: which cap cut the turn."""
        ids, raw = generation.token_ids, generation.finish_reason
        if raw == "length":
            # Fewer tokens than asked: the server hit its own context limit.
            return cap_reason if len(ids) >= cap else FinishReason.CONTEXT.value
        if raw == "stop" or (ids and ids[-1] in self.builder.tok.end_ids):
            return FinishReason.STOP.value
        return raw

    def _tokenize_text_answer(self, generation: Generation) -> Generation:
        """Text-only backends: re-tokenize the answer (inexact) and close it with an end token."""
        tok = self.builder.tok
        ids = tok.encode(generation.text)
        if generation.finish_reason == "stop" and tok.hf.eos_token_id is not None:
            ids.append(tok.hf.eos_token_id)
        generation.token_ids, generation.logprobs = ids, [0.0] * len(ids)
        return generation

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
            self.pool.end_generation()
            self.pool.release(self.server.url)
        self.server = None
        self.closed = True


class _DeltaRedone(Exception):
    """A request went out with a head-only delta the whole render disagreed with: it is
    dropped (its connection closed) and asked again with the redone delta (`_generate`), or,
    when the whole render failed, `error` is raised (outside the backend call, so it is not
    taken for the server's)."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__("the prompt's template delta was redone")
        self.error = error
