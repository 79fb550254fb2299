"""OpenAI's chat-completions wire: request -> `CallRequest`, `Completion` -> JSON or SSE chunks.

Shapes follow the official `openai` SDK's models (`ChatCompletion`, `ChatCompletionChunk`,
the `{"error": {...}}` body). Sampling is the job's (the trainer trains on it): a request's
temperature, top_p, seed, penalties and stop strings are ignored and counted in the rollout's
metrics (`ignored_params`); what would change the API's promise (n > 1, logit_bias, a forced
tool choice, a JSON response format) is refused with a 400 naming the field.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

from agents.harness.calls import CallError, CallRequest, Completion
from agents.harness.messages import check_messages, function_tools
from core.errors import InvalidRequest

IGNORED = (
    "temperature",
    "top_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "top_k",
    "min_p",
    "repetition_penalty",
)
# Fields that change nothing the endpoint promises (accepted silently).
NEUTRAL = (
    "model",
    "messages",
    "tools",
    "tool_choice",
    "stream",
    "stream_options",
    "n",
    "max_tokens",
    "max_completion_tokens",
    "user",
    "metadata",
    "store",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
    "response_format",
    "logit_bias",
    "service_tier",
    "reasoning_effort",
    "modalities",
    "prediction",
    "extra_body",
)


def parse_request(body: dict[str, Any]) -> CallRequest:
    """The call a `/v1/chat/completions` body asks for (InvalidRequest names a bad field)."""
    n = body.get("n")
    if n not in (None, 1):
        raise InvalidRequest(f"n: only n=1 is supported (got {n!r}); send one request per sample")
    if body.get("logit_bias"):
        raise InvalidRequest("logit_bias is not supported: the job's sampling is fixed")
    fmt = (body.get("response_format") or {}).get("type", "text")
    if fmt != "text":
        raise InvalidRequest(f"response_format {fmt!r} is not supported (text only)")
    return CallRequest(
        api="openai",
        messages=check_messages(body.get("messages")),
        tools=function_tools(body.get("tools")),
        parse_tools=_tool_choice(body.get("tool_choice")),
        max_tokens=_max_tokens(body),
        stream=bool(body.get("stream")),
        ignored=[k for k in IGNORED if body.get(k) is not None],
    )


def _tool_choice(choice: Any) -> bool:
    """True when tool calls are parsed ("auto"), False for "none"; others are refused."""
    if choice in (None, "auto"):
        return True
    if choice == "none":
        return False
    raise InvalidRequest(
        f'tool_choice {choice!r} is not supported: raas cannot force a tool call on the policy; use "auto" or "none"'
    )


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"max_tokens must be a positive integer (got {value!r})")
    return value


def _message(c: Completion) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.content}
    if c.tool_calls:
        message["tool_calls"] = [
            {
                "id": t.id,
                "type": "function",
                "function": {"name": t.name, "arguments": json.dumps(t.arguments, ensure_ascii=False)},
            }
            for t in c.tool_calls
        ]
    return message


def _usage(c: Completion) -> dict[str, int]:
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    }


def completion_body(c: Completion, model: str) -> dict[str, Any]:
    """A `chat.completion` object."""
    return {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": _message(c), "logprobs": None, "finish_reason": c.finish}],
        "usage": _usage(c),
    }


def stream_events(c: Completion, model: str, include_usage: bool) -> Iterator[str]:
    """The SSE `data:` payloads of a streamed answer, `[DONE]` last (the reply is whole by
    the time it is streamed: the server's tokens are needed before anything can be parsed)."""
    head = {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return json.dumps(
            {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        )

    yield chunk({"role": "assistant", "content": ""})
    if c.content:
        yield chunk({"content": c.content})
    for i, t in enumerate(c.tool_calls):
        yield chunk(
            {
                "tool_calls": [
                    {"index": i, "id": t.id, "type": "function", "function": {"name": t.name, "arguments": ""}}
                ]
            }
        )
        yield chunk(
            {"tool_calls": [{"index": i, "function": {"arguments": json.dumps(t.arguments, ensure_ascii=False)}}]}
        )
    yield chunk({}, c.finish)
    if include_usage:
        yield json.dumps({**head, "choices": [], "usage": _usage(c)})
    yield "[DONE]"


_TYPES = {
    "authentication": "invalid_request_error",
    "unavailable": "server_error",
    "not_found": "invalid_request_error",
}
_CODES = {"authentication": "invalid_api_key", "invalid_request": None, "unavailable": None, "not_found": "unknown_url"}


def error_body(exc: CallError) -> dict[str, Any]:
    """OpenAI's error object; `code` says why (`context_length_exceeded`, ...)."""
    return {
        "error": {
            "message": exc.message,
            "type": _TYPES.get(exc.kind, "invalid_request_error"),
            "param": "messages" if exc.kind == "context_length_exceeded" else None,
            "code": _CODES.get(exc.kind, exc.kind),
        }
    }


def models_body(model: str) -> dict[str, Any]:
    """`GET /v1/models`: the one model this endpoint serves."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "raas"}]}
