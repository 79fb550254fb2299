"""One model call of a harness, API-neutral: prompt, generation, reply, turn record.

Both wire routes (`openai_wire`, `anthropic_wire`) turn a request into a `CallRequest`, hand it
to `CallRunner.complete` and turn the `Completion` (or a `CallError`) into their API's shape.
Everything a call does to the rollout goes through the rollout's `LLMSession` (`ctx.llm`):
sticky server, weight version, pool pause, cancel, deadline, context and per-turn length;
the samples are the `SampleTracker`'s.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from agents.contexts import RunContext
from agents.counters import EndpointCounters
from agents.finish_reasons import CUT_TURN, FinishReason
from agents.harness.replay import CallReplay, logged_call_ids, logged_generation
from agents.harness.replies import cut_at_stop, split_thinking, token_logprobs
from agents.harness.samples import Prepared, SampleTracker
from agents.harness.streaming import ReplyStream
from agents.llm.template_budget import TemplateOverBudget
from agents.llm.tool_calls import CLOSE_TAG, OPEN_TAG, parse_tool_calls
from agents.llm.trajectory import TrajectoryBuilder
from core.errors import (
    InvalidRequest,
    RaasError,
    RolloutCancelled,
    ServiceUnavailable,
    StageTimeout,
)

log = logging.getLogger(__name__)

_CALL_BLOCK = re.compile(re.escape(OPEN_TAG) + ".*?" + re.escape(CLOSE_TAG), re.DOTALL)
_FIELD = re.compile(r"^([A-Za-z_]+)")


class CallError(RaasError):
    """A call the endpoint answers with an API error; `kind` picks the API's error shape."""

    def __init__(self, kind: str, message: str, status: int = 400, **details: Any) -> None:
        super().__init__(message, **details)
        self.kind = kind  # invalid_request | context_length_exceeded | token_budget_exceeded
        # | deadline_exceeded | cancelled | unavailable | authentication
        self.status = status


@dataclass
class CallRequest:
    """A call in the endpoint's own terms (both APIs map onto it)."""

    api: str  # "openai" | "anthropic"
    messages: list[dict[str, Any]]  # OpenAI-style, checked (`messages.check_messages`)
    tools: list[dict[str, Any]] | None = None  # function schemas, as the template takes them
    parse_tools: bool = True  # False for tool_choice "none"
    require_call: bool = False  # tool_choice required/any/a named tool: the API promises a call
    required_name: str | None = None  # ... of this tool (a named tool_choice)
    single_tool_call: bool = False  # parallel_tool_calls false / disable_parallel_tool_use
    stop: list[str] = field(default_factory=list)  # stop strings, sent to the server
    thinking: bool = False  # Anthropic `thinking` enabled: a `<think>` block is returned as one
    logprobs: bool = False  # OpenAI `logprobs`: each generated token's logprob is returned
    max_tokens: int | None = None
    stream: bool = False
    received: float | None = None  # time.monotonic() the endpoint read the request (TTFT's start)
    ignored: list[str] = field(default_factory=list)  # sampling fields the job's sampling overrides
    unenforced: list[str] = field(default_factory=list)  # accepted, answered, not enforced (no
    # forced decoding): e.g. a JSON response_format, top_logprobs


@dataclass
class ToolCallOut:
    """A parsed tool call as returned to the harness."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class Completion:
    """What one call produced."""

    text: str  # what the model generated, decoded
    content: str | None  # the text outside tool-call markup (None when only tool calls)
    tool_calls: list[ToolCallOut]
    finish: str  # "stop" | "length" | "tool_calls" (OpenAI's words; Anthropic maps them)
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None  # the request's stop string that ended the reply
    reasoning: str | None = None  # the `<think>` block, when thinking was asked for
    token_logprobs: list[tuple[str, float]] | None = None  # when logprobs were asked for


class CallRunner:
    """Runs the calls of one rollout, one at a time (a trajectory is sequential)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.session = ctx.llm
        self.stats = EndpointCounters()
        self.tracker = SampleTracker(self._new_builder)
        self.lock = threading.Lock()
        self.closing = False  # set by the endpoint's exit: an in-flight generation stops
        self.fatal: BaseException | None = None  # cancel / infra failure seen by a call
        # An earlier attempt's logged calls, answered while requests match (`replay`); None
        # on a first attempt: nothing is compared then.
        self.replay = CallReplay(ctx.resume_turns, ctx.workspace) if ctx.resume_turns else None
        # A merge's delta is rendered head-only and checked while the server generates; not
        # while replaying (a logged call is matched on the delta's ids before any generation).
        self.tracker.speculate = self.replay is None

    def _new_builder(self) -> TrajectoryBuilder:
        """A builder like the session's (same tokenizer, template, current context limit)."""
        current = self.session.builder
        return TrajectoryBuilder(
            current.tok, current.max_model_len, current.template_kwargs, token_exact=current.token_exact
        )

    def complete(self, request: CallRequest, stream: ReplyStream | None = None) -> Completion:
        """Answer one call (serialised with the rollout's other calls); with `stream` the
        reply's text is passed on as the server generates it (`streaming.ReplyStream`)."""
        with self.lock:
            self.stats.calls += 1
            for name in request.ignored:
                _count(self.stats.ignored_params, name)
            for name in request.unenforced:
                _count(self.stats.unenforced_params, name)
            try:
                return self._complete(request, stream)
            except TEMPLATE_FAILURES as exc:
                self._failed(TEMPLATE_ERROR)
                _count(self.stats.refusals, "chat_template")
                raise template_error(exc) from exc
            except CallError as exc:
                self._failed(exc.kind)
                raise

    def refused(self, kind: str, exc: Exception | None = None) -> None:
        """Count a call refused before it reached the runner (a malformed request); `exc`
        (an InvalidRequest) names the field, counted in `refusals`."""
        with self.lock:
            self.stats.calls += 1
            self._failed(kind)
            if exc is not None:
                _count(self.stats.refusals, refused_field(exc))

    def count_tokens(self, request: CallRequest) -> int:
        """The prompt tokens `request` would be rendered to, as a call would render it
        (Anthropic's `count_tokens`); nothing is generated or recorded."""
        with self.lock:
            try:
                return self.tracker.count_prompt(request.messages, request.tools)
            except TEMPLATE_FAILURES as exc:
                raise template_error(exc) from exc

    def _failed(self, kind: str) -> None:
        self.stats.failed_calls += 1
        self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1

    def _complete(self, request: CallRequest, stream: ReplyStream | None) -> Completion:
        self._check_alive()
        prepared = self.tracker.prepare(request.messages, request.tools)
        if not prepared.fits:
            raise _context_error(prepared.prompt_tokens, self.session.context_length)
        self.session.builder = self.tracker.current.builder
        logged = self.replay.take(prepared, self._decode) if self.replay is not None else None
        if logged is not None:  # answered from the log: nothing is generated (`replay`)
            gen, seconds = logged_generation(self.session.builder, logged), float(logged.get("gen_seconds") or 0)
        else:
            if stream is not None:
                stream.prompt_tokens = prepared.prompt_tokens
                stream.live = not (request.thinking and self._prompt_opens_thinking())
            started = time.monotonic()
            try:
                gen = self._generate(request, stream)
            finally:
                prepared = self.tracker.confirmed(prepared)  # the delta as sent (redone if it had to be)
            seconds = time.monotonic() - started
        if not gen.token_ids and gen.finish_reason in CUT_TURN:
            raise self._no_room(gen.finish_reason, prepared)
        completion, errors = self._reply(request, gen, prepared, logged_call_ids(logged) if logged else None)
        self.tracker.generated(_openai_reply(completion), gen.text or "")
        self.stats.generated_tokens += len(gen.token_ids)
        self._record(request, gen, prepared, completion, errors, seconds, stream, logged)
        return completion

    def _decode(self, ids: list[int]) -> str:
        return self.session.builder.tok.hf.decode(ids, skip_special_tokens=False)

    def _prompt_opens_thinking(self) -> bool:
        """Whether the prompt ends inside a `<think>` block (a thinking template's generation
        prompt opens one): then the reply's text up to `</think>` is reasoning."""
        traj = self.session.builder.trajectory()
        tail = (traj.prompt_ids + traj.response_ids)[-16:]
        text = self.session.builder.tok.hf.decode(tail, skip_special_tokens=False)
        return text.rfind("<think>") > text.rfind("</think>")

    def _check_alive(self) -> None:
        if self.closing:
            raise CallError("cancelled", "this rollout's endpoint is closed", 400)
        if self.ctx.cancel_check():
            self.fatal = self.fatal or RolloutCancelled("rollout cancelled", rollout_id=self.ctx.rollout_id)
            raise CallError("cancelled", "the rollout was cancelled")
        if self.ctx.remaining() <= 0:
            raise CallError("deadline_exceeded", "the rollout's RUN deadline has passed")
        if self._tokens_left() == 0:
            raise CallError(
                "token_budget_exceeded",
                f"the rollout's generated-token budget (limits.max_tokens = {self.ctx.limits.max_tokens}) is spent",
            )

    def _tokens_left(self) -> int | None:
        budget = self.ctx.limits.max_tokens
        return None if not budget else max(0, int(budget) - self.stats.generated_tokens)

    def _generate(self, request: CallRequest, stream: ReplyStream | None = None) -> Any:
        """One generation through the session; its failures become the API's errors."""
        left = self._tokens_left()
        caps = [c for c in (left, request.max_tokens) if c is not None]
        try:
            gen = self.session.generate(
                self.ctx.deadline,
                self._cancelled,
                max_new_tokens=min(caps) if caps else None,
                stop=request.stop,
                stream=stream,
            )
        except StageTimeout as exc:
            raise CallError("deadline_exceeded", f"the rollout's RUN deadline passed: {exc}") from exc
        except RolloutCancelled as exc:
            if not self.closing:
                self.fatal = self.fatal or exc
            raise CallError("cancelled", "the rollout was cancelled") from exc
        except ServiceUnavailable as exc:
            self.fatal = self.fatal or exc
            raise CallError("unavailable", f"no inference server: {exc}", 503) from exc
        except TemplateOverBudget:  # the template's check while the server worked: not the server's
            raise
        except InvalidRequest as exc:  # the server refused the request (not for its length)
            raise CallError("invalid_request", f"the inference server refused the call: {exc.message}") from exc
        _extend_deadline(self.ctx, gen.paused_seconds)  # a paused pool: not the agent's time
        if (
            gen.finish_reason == FinishReason.TOKEN_BUDGET.value
            and request.max_tokens is not None
            and (left is None or request.max_tokens < left)
        ):
            # The request's own max_tokens cut it, not the rollout's budget.
            gen.finish_reason = FinishReason.TURN_LENGTH.value
            self.session.trajectory().finish_reason = gen.finish_reason
        return gen

    def _cancelled(self) -> bool:
        return self.closing or self.ctx.cancel_check()

    def _no_room(self, reason: str, prepared: Prepared) -> CallError:
        if reason == FinishReason.CONTEXT.value:
            return _context_error(prepared.prompt_tokens, self.session.context_length)
        return CallError(
            "token_budget_exceeded",
            f"the rollout's generated-token budget (limits.max_tokens = {self.ctx.limits.max_tokens}) is spent",
        )

    def _reply(
        self, request: CallRequest, gen: Any, prepared: Prepared, ids: list[str] | None = None
    ) -> tuple[Completion, list[str]]:
        """The answer to the harness, and the tool-call parse errors of the reply (`ids`: the
        tool-call ids a replayed reply had). The policy was sampled as it is: a demanded tool
        call it did not make is counted, not forced."""
        text, matched = cut_at_stop(gen.text or "", request.stop, gen.stop_reason)
        reasoning, text = split_thinking(text) if request.thinking else (None, text)
        cut = gen.finish_reason in CUT_TURN
        calls, errors = ([], []) if cut or not request.parse_tools else parse_tool_calls(text)
        self.stats.malformed_tool_calls += len(errors)
        if errors:
            calls = []  # a reply that half-parsed is returned as text: the harness sees it all
        if request.tools and not calls:
            self.stats.replies_without_tool_call += 1
        if request.require_call and not any(request.required_name in (None, c.name) for c in calls):
            self.stats.tool_choice_unmet += 1
        if request.single_tool_call and len(calls) > 1:
            _count(self.stats.unenforced_params, "parallel_tool_calls")
        if ids is None or len(ids) != len(calls):
            ids = [f"call_{secrets.token_hex(12)}" for _ in calls]
        out = [ToolCallOut(i, c.name, c.arguments) for i, c in zip(ids, calls)]
        self.stats.tool_calls += len(out)
        content = _outside_calls(text) if out else text
        finish = "length" if cut else ("tool_calls" if out else "stop")
        completion = Completion(
            text, content or (None if out else ""), out, finish, prepared.prompt_tokens, len(gen.token_ids)
        )
        completion.stop_sequence = matched if finish == "stop" else None
        completion.reasoning = reasoning
        if request.logprobs:
            completion.token_logprobs = token_logprobs(self.session.builder.tok, gen.token_ids, gen.logprobs)
        return completion, errors

    def _record(
        self,
        request: CallRequest,
        gen: Any,
        prepared: Prepared,
        completion: Completion,
        errors: list[str],
        seconds: float,
        stream: ReplyStream | None = None,
        logged: dict[str, Any] | None = None,
    ) -> None:
        """Log the call as a turn (the pipeline writes it before the reply is sent). A
        streamed call's `ttft_ms`: from reading the request to writing its first text (or,
        when none could go out early, to now: the reply is written next). `logged`: the
        earlier attempt's turn it was answered from."""
        extra: dict[str, Any] = {
            "api": request.api,
            "stream": request.stream,
            "sample": prepared.sample,
            "merged": prepared.merged,
            "split_reason": prepared.split_reason,
            "prompt_tokens": prepared.prompt_tokens,
            "context_length": self.session.context_length,
            "paused_seconds": round(gen.paused_seconds, 6),  # a weight push: not charged
            "tool_call_parsed": (None if not request.tools else bool(completion.tool_calls) and not errors),
        }
        if request.stream and request.received is not None:
            first = stream.first_at if stream is not None and stream.first_at is not None else time.monotonic()
            extra["ttft_ms"] = round((first - request.received) * 1000, 3)
            self.stats.ttft_ms.append(extra["ttft_ms"])
        if request.require_call:
            extra["tool_choice"] = request.required_name or "required"
        if completion.stop_sequence is not None:
            extra["stop_sequence"] = completion.stop_sequence  # the ids hold it; the reply does not
        extra["delta_ids" if prepared.merged else "prompt_ids"] = list(prepared.ids)
        if errors:
            extra["parse_errors"] = errors
        if getattr(gen, "logprobs_mode", None):
            extra["logprobs_mode"] = gen.logprobs_mode
        if completion.tool_calls:  # a replay returns the same ones
            extra["tool_call_ids"] = [c.id for c in completion.tool_calls]
        extra["workspace"] = self.ctx.workspace  # what a replay masks (each attempt has its own)
        if self.replay is not None:
            extra.update(self.replay.on_turn(logged))
        index, self.stats.turns = self.stats.turns, self.stats.turns + 1
        self.ctx.record_turn(
            index=index,
            generated_ids=list(gen.token_ids),
            logprobs=list(gen.logprobs or []),
            text=gen.text,
            tool_calls=[{"name": c.name, "arguments": c.arguments} for c in completion.tool_calls],
            finish_reason=gen.finish_reason,
            llm_server=gen.server,
            weight_version=gen.weight_version,
            gen_seconds=round(seconds, 6),
            extra=extra,
        )
        # Durable before the harness sees the reply: the harness runs its tools itself, so
        # this call is the only point where a turn that cannot be logged (a lost lease)
        # can still fail the rollout before anything else happens.
        self.ctx.settle_turns()


def _count(counts: dict[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1


# The job's chat template failed on this conversation: its own `raise_exception` (a role
# order or a message shape it does not take), a bad value, or its render budget. That is the
# job's template meeting what this harness sends, not the infrastructure (no retry would render
# it) and not the policy: answered 400 naming the template's message, counted as a refusal
# (`endings`: `infra_error` / `endpoint_refused`, not graded, not retried).
TEMPLATE_FAILURES = (TemplateError, TemplateOverBudget)
TEMPLATE_ERROR = "chat_template_error"


def template_error(exc: Exception) -> CallError:
    """The API error a template failure is answered with, naming the template's message."""
    said = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return CallError(TEMPLATE_ERROR, f"the job's chat template cannot render this conversation: {said}", 400)


def refused_field(exc: Exception) -> str:
    """The request field a refusal names: its `field` detail, else the word its message
    starts with (every refusal's message names the field first: `tool_choice ...`)."""
    named = getattr(exc, "details", {}).get("field")
    found = _FIELD.match(str(getattr(exc, "message", exc)))
    return str(named or (found.group(1) if found else "request"))


def _extend_deadline(ctx: RunContext, seconds: float) -> None:
    """Move RUN's deadline on by time the pool was paused (not the agent's)."""
    if seconds:
        ctx.extend_deadline(seconds)


def _outside_calls(text: str) -> str:
    """The reply's text with its `<tool_call>` blocks taken out."""
    return _CALL_BLOCK.sub("", text).strip()


def _openai_reply(completion: Completion) -> dict[str, Any]:
    """The reply as an OpenAI assistant message (what the next request echoes)."""
    message: dict[str, Any] = {"role": "assistant", "content": completion.content}
    if completion.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in completion.tool_calls
        ]
    return message


def _context_error(prompt_tokens: int, limit: int) -> CallError:
    """OpenAI's wording (LiteLLM and harnesses match on it)."""
    return CallError(
        "context_length_exceeded",
        f"This model's maximum context length is {limit} tokens. However, your "
        f"messages resulted in {prompt_tokens} tokens. Please reduce the length "
        "of the messages.",
        prompt_tokens=prompt_tokens,
        limit=limit,
    )
