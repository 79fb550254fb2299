"""Anthropic's messages wire: `/v1/messages` -> `CallRequest`, `Completion` -> JSON or events.

The request is mapped onto the OpenAI-style messages the rest of the endpoint speaks: `system`
becomes a system message, `tool_use` blocks become an assistant message's tool calls and
`tool_result` blocks become tool messages (in order, before any text of the same user turn).
Shapes follow the official `anthropic` SDK (`Message`, the streaming events `message_start`,
`ping`, `content_block_start/delta/stop`, `message_delta`, `message_stop`, and the
`{"type": "error", "error": {...}}` body). Sampling is the job's, as on the OpenAI route;
`stop_sequences` are honoured (a reply they end says `stop_reason: "stop_sequence"`).
`tool_choice` `any` / `tool` is accepted and the policy sampled as it is (a reply without the
call ends `end_turn`, counted as `tool_choice_unmet`). `thinking` is accepted: a reply that
opens with `<think>...</think>` comes back as a `thinking` block. `cache_control` marks,
`metadata` and `anthropic-beta` headers change nothing here and are accepted.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

from agents.harness.calls import CallError, CallRequest, Completion
from agents.harness.messages import check_messages
from agents.harness.openai_wire import stop_strings
from core.errors import InvalidRequest

IGNORED = ("temperature", "top_p", "top_k")
SIGNATURE = "raas-unsigned"
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
THINKING = ("enabled", "disabled", "adaptive")


def parse_request(body: dict[str, Any], count_only: bool = False) -> CallRequest:
    """The call a `/v1/messages` body asks for (InvalidRequest names a bad field);
    `count_only`: a `count_tokens` body (no `max_tokens`)."""
    max_tokens = body.get("max_tokens")
    if not count_only and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise InvalidRequest("max_tokens: a positive integer is required", field="max_tokens")
    messages = [{"role": "system", "content": _text(body["system"], "system")}] if body.get("system") else []
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("messages: a non-empty list is required", field="messages")
    for i, message in enumerate(raw):
        messages += _convert(message, f"messages[{i}]")
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none") or (kind == "tool" and not isinstance(choice.get("name"), str)):
        raise InvalidRequest(
            f"tool_choice {choice!r} is not auto, any, tool (with a name) or none", field="tool_choice"
        )
    return CallRequest(
        api="anthropic",
        messages=check_messages(messages),
        tools=_tools(body.get("tools")),
        parse_tools=kind != "none",
        require_call=kind in ("any", "tool"),
        required_name=choice.get("name") if kind == "tool" else None,
        single_tool_call=bool(choice.get("disable_parallel_tool_use")),
        stop=stop_strings(body.get("stop_sequences"), "stop_sequences"),
        thinking=_thinking(body.get("thinking")),
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        ignored=[k for k in IGNORED if body.get(k) is not None],
    )


def _thinking(value: Any) -> bool:
    """Whether the request enabled extended thinking (`{"type": "enabled", "budget_tokens": N}`)."""
    if value is None:
        return False
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in THINKING:
        raise InvalidRequest(f"thinking {value!r} is not one of types {', '.join(THINKING)}", field="thinking")
    return kind != "disabled"


def _text(content: Any, where: str) -> str:
    """Text of a string or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_block_text(b, where) for b in content)
    raise InvalidRequest(f"{where}: a string or a list of text blocks is required")


def _block_text(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        raise InvalidRequest(f"{where}: content block of type {kind!r} is not supported here")
    return str(block.get("text") or "")


def _convert(message: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI-style messages."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise InvalidRequest(f"{where}: role must be user or assistant")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": message["role"], "content": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: content must be a string or a list of blocks")
    if message["role"] == "assistant":
        return [_assistant(content, where)]
    results = [
        {"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _result_text(b, where)}
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    texts = [_block_text(b, where) for b in content if not (isinstance(b, dict) and b.get("type") == "tool_result")]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts else [])


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    text, calls = [], []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": block.get("input") or {}},
                }
            )
        elif kind not in ("thinking", "redacted_thinking"):
            text.append(_block_text(block, where))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    return message


def _result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    text = "" if content is None else _text(content, f"{where} tool_result")
    return f"Error: {text}" if block.get("is_error") else text


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    if not isinstance(tools, list):
        raise InvalidRequest("tools: a list is required")
    out = []
    for i, tool in enumerate(tools):
        if (
            not isinstance(tool, dict)
            or not isinstance(tool.get("name"), str)
            or tool.get("type") not in (None, "custom")
        ):
            raise InvalidRequest(f"tools[{i}]: only custom tools with a name and an input_schema are supported")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool.get("description", ""),
                    "parameters": tool.get("input_schema") or {"type": "object"},
                },
            }
        )
    return out


def _blocks(c: Completion) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if c.reasoning is not None:
        # No signature can be made for a policy's own reasoning; the field is opaque to
        # clients, which send it back (and the endpoint drops thinking blocks it is sent).
        blocks.append({"type": "thinking", "thinking": c.reasoning, "signature": SIGNATURE})
    blocks += [{"type": "text", "text": c.content}] if c.content else []
    blocks += [{"type": "tool_use", "id": _tool_id(t.id), "name": t.name, "input": t.arguments} for t in c.tool_calls]
    return blocks


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _message(
    c: Completion, model: str, content: list[dict[str, Any]], stop: str | None, output_tokens: int
) -> dict[str, Any]:
    return {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": c.stop_sequence if stop is not None else None,
        "usage": {"input_tokens": c.prompt_tokens, "output_tokens": output_tokens},
    }


def message_body(c: Completion, model: str) -> dict[str, Any]:
    """A `message` object."""
    return _message(c, model, _blocks(c), _stop_reason(c), c.completion_tokens)


def _stop_reason(c: Completion) -> str:
    return "stop_sequence" if c.stop_sequence is not None else _STOP[c.finish]


def stream_events(c: Completion, model: str) -> Iterator[str]:
    """The SSE events of a reply streamed whole, as the Messages API sends them (nothing of it
    was sent while generating: see `LiveMessages` for the live form)."""
    yield _event("message_start", message=_message(c, model, [], None, 1))
    yield _event("ping")
    yield from _block_events(_blocks(c), 0)
    yield from _closing(c)


class LiveMessages:
    """The Messages event stream of one reply whose text streams as it is generated
    (`streaming.WireStream`; never with thinking: its block would have to come first)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.c_id = f"msg_{secrets.token_hex(12)}"

    def head(self, prompt_tokens: int) -> Iterator[str]:
        opening = Completion("", None, [], "stop", prompt_tokens, 0)
        message = {**_message(opening, self.model, [], None, 1), "id": self.c_id}
        yield _event("message_start", message=message)
        yield _event("ping")
        yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})

    def text(self, delta: str) -> Iterator[str]:
        yield _event("content_block_delta", index=0, delta={"type": "text_delta", "text": delta})

    def tail(self, c: Completion, rest: str) -> Iterator[str]:
        if rest:
            yield from self.text(rest)
        yield _event("content_block_stop", index=0)
        yield from _block_events([b for b in _blocks(c) if b["type"] != "text"], 1)
        yield from _closing(c)

    def error(self, body: dict[str, Any]) -> Iterator[str]:
        yield _event("error", error=body["error"])


def _event(name: str, **data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n"


def _block_events(blocks: list[dict[str, Any]], first: int) -> Iterator[str]:
    """Each content block's start, delta(s) and stop, indexed from `first`."""
    for i, block in enumerate(blocks, first):
        if block["type"] == "thinking":
            yield _event("content_block_start", index=i, content_block={**block, "thinking": "", "signature": ""})
            yield _event(
                "content_block_delta", index=i, delta={"type": "thinking_delta", "thinking": block["thinking"]}
            )
            yield _event("content_block_delta", index=i, delta={"type": "signature_delta", "signature": SIGNATURE})
        elif block["type"] == "text":
            yield _event("content_block_start", index=i, content_block={"type": "text", "text": ""})
            yield _event("content_block_delta", index=i, delta={"type": "text_delta", "text": block["text"]})
        else:
            yield _event("content_block_start", index=i, content_block={**block, "input": {}})
            yield _event(
                "content_block_delta",
                index=i,
                delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
            )
        yield _event("content_block_stop", index=i)


def _closing(c: Completion) -> Iterator[str]:
    yield _event(
        "message_delta",
        delta={"stop_reason": _stop_reason(c), "stop_sequence": c.stop_sequence},
        usage={"output_tokens": c.completion_tokens},
    )
    yield _event("message_stop")


_ERROR_TYPES = {"authentication": "authentication_error", "unavailable": "api_error", "not_found": "not_found_error"}


def error_body(exc: CallError) -> dict[str, Any]:
    """Anthropic's error object; a context overflow reads as the API's own
    ("prompt is too long: N tokens > M maximum"), which harnesses match on."""
    message = exc.message
    if exc.kind == "context_length_exceeded":
        message = f"prompt is too long: {exc.details.get('prompt_tokens')} tokens > {exc.details.get('limit')} maximum"
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(exc.kind, "invalid_request_error"), "message": message}}
