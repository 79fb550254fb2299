"""OpenAI's chat-completions wire: request -> `CallRequest`, `Completion` -> JSON or SSE chunks.

Shapes follow the official `openai` SDK's models (`ChatCompletion`, `ChatCompletionChunk`,
the `{"error": {...}}` body). Sampling is the job's (the trainer trains on it): a request's
temperature, top_p, seed, penalties and logit_bias are ignored and counted in the rollout's
metrics (`ignored_params`). `stop` strings are honoured (sent to the server). What only forced
decoding could promise (`tool_choice` required or a named function, a JSON `response_format`)
is accepted and the policy sampled as it is: a reply without the demanded call is answered as
it is and counted (`tool_choice_unmet`), a JSON format counted in `unenforced_params`. Only
`n` > 1 is refused, with a 400 naming the field.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

from agents.harness.calls import CallError, CallRequest, Completion
from agents.harness.messages import check_messages, function_tools
from agents.llm.backends.abstract import encode_answer
from core.errors import InvalidRequest

IGNORED = (
    "temperature",
    "top_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "top_k",
    "min_p",
    "repetition_penalty",
    "logit_bias",
)
# Accepted without effect on the call: `user`, `metadata`, `store`, `service_tier`,
# `reasoning_effort`, `modalities`, `prediction`, `stream_options` (include_usage is answered),
# `parallel_tool_calls: true`; and any field not named here (a newer SDK's).
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def parse_request(body: dict[str, Any]) -> CallRequest:
    """The call a `/v1/chat/completions` body asks for (InvalidRequest names a bad field)."""
    n = body.get("n")
    if n not in (None, 1):
        raise InvalidRequest(f"n: only n=1 is supported (got {n!r}); send one request per sample", field="n")
    fmt = (body.get("response_format") or {}).get("type", "text")
    if fmt not in RESPONSE_FORMATS:
        raise InvalidRequest(f"response_format {fmt!r} is not a known format", field="response_format")
    parse_tools, require, name = tool_choice(body.get("tool_choice"))
    unenforced = ["response_format"] if fmt != "text" else []
    if body.get("top_logprobs"):
        unenforced.append("top_logprobs")  # only the sampled token's logprob is known
    return CallRequest(
        api="openai",
        messages=check_messages(body.get("messages")),
        tools=function_tools(body.get("tools")),
        parse_tools=parse_tools,
        require_call=require,
        required_name=name,
        single_tool_call=body.get("parallel_tool_calls") is False,
        stop=stop_strings(body.get("stop"), "stop"),
        logprobs=bool(body.get("logprobs")),
        max_tokens=_max_tokens(body),
        stream=bool(body.get("stream")),
        ignored=[k for k in IGNORED if body.get(k) is not None],
        unenforced=unenforced,
    )


def tool_choice(choice: Any) -> tuple[bool, bool, str | None]:
    """(parse tool calls, a call is demanded, of which tool) for an OpenAI `tool_choice`:
    "auto", "none", "required", a named function or custom tool, `allowed_tools`."""
    if choice in (None, "auto"):
        return True, False, None
    if choice == "none":
        return False, False, None
    if choice == "required":
        return True, True, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    named = (choice.get(kind) or {}).get("name") if kind in ("function", "custom") else None
    if isinstance(named, str):
        return True, True, named
    if kind == "allowed_tools":
        return True, (choice.get("allowed_tools") or {}).get("mode") == "required", None
    raise InvalidRequest(
        f'tool_choice {choice!r} is not one of "auto", "none", "required", a named function', field="tool_choice"
    )


def stop_strings(value: Any, name: str) -> list[str]:
    """A `stop` (a string or a list of strings) as a list; InvalidRequest names `name`."""
    if value is None:
        return []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise InvalidRequest(f"{name}: a string or a list of non-empty strings is required", field=name)
    return values


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"max_tokens must be a positive integer (got {value!r})", field="max_tokens")
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


def _logprobs(c: Completion) -> dict[str, Any] | None:
    """`choice.logprobs` of a request that asked (each generated token, no alternatives)."""
    if c.token_logprobs is None:
        return None
    content = [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []} for t, lp in c.token_logprobs]
    return {"content": content, "refusal": None}


def completion_body(c: Completion, model: str) -> dict[str, Any]:
    """A `chat.completion` object."""
    return {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": _message(c), "logprobs": _logprobs(c), "finish_reason": c.finish}],
        "usage": _usage(c),
    }


def stream_events(c: Completion, model: str, include_usage: bool) -> Iterator[str]:
    """The SSE events (`data: ...`) of a reply streamed whole, `[DONE]` last (nothing of it was
    sent while generating: see `LiveChat` for the live form)."""
    live = LiveChat(model, include_usage)
    yield from live.head()
    if c.content or c.token_logprobs is not None:
        yield live._chunk({"content": c.content or ""}, logprobs=_logprobs(c))
    yield from live._after_text(c)


class LiveChat:
    """The `chat.completion.chunk` stream of one reply (`streaming.WireStream`): the role
    chunk, the content pieces, then the logprobs, tool calls, finish reason and usage."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.include_usage = include_usage
        self.head_fields = {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return _data(_json({**self.head_fields, "choices": [choice]}))

    def head(self, prompt_tokens: int = 0) -> Iterator[str]:
        yield self._chunk({"role": "assistant", "content": ""})

    def text(self, delta: str) -> Iterator[str]:
        yield self._chunk({"content": delta})

    def tail(self, c: Completion, rest: str) -> Iterator[str]:
        if rest or c.token_logprobs is not None:
            yield self._chunk({"content": rest}, logprobs=_logprobs(c))
        yield from self._after_text(c)

    def error(self, body: dict[str, Any]) -> Iterator[str]:
        yield _data(json.dumps(body, ensure_ascii=False))  # OpenAI's mid-stream error: a data event
        yield _data("[DONE]")

    def _after_text(self, c: Completion) -> Iterator[str]:
        for i, t in enumerate(c.tool_calls):
            opened = {"index": i, "id": t.id, "type": "function", "function": {"name": t.name, "arguments": ""}}
            yield self._chunk({"tool_calls": [opened]})
            arguments = json.dumps(t.arguments, ensure_ascii=False)
            yield self._chunk({"tool_calls": [{"index": i, "function": {"arguments": arguments}}]})
        yield self._chunk({}, c.finish)
        if self.include_usage:
            yield _data(json.dumps({**self.head_fields, "choices": [], "usage": _usage(c)}))
        yield _data("[DONE]")


def _data(payload: str) -> str:
    return f"data: {payload}\n\n"


def _json(value: Any) -> str:
    """`value` as compact JSON (orjson: a chunk is written per streamed piece of text, the first
    on the time to first token)."""
    return encode_answer(value).decode()


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
