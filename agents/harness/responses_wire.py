"""OpenAI's Responses wire (`POST /v1/responses`): input items -> `CallRequest`, `Completion` ->
a `Response` object or its stream of events.

It is the only wire API of Codex CLI and the default of the OpenAI Agents SDK. Input items
become the endpoint's OpenAI-style messages: `instructions` a system message, message items
their role's message, a model turn's `reasoning` / assistant `message` / `function_call` items
one assistant message with tool calls, `function_call_output` items tool messages. A harness
sends the whole history each call (`store: false`), or names an earlier response of the same
rollout with `previous_response_id` (kept in memory for the endpoint's life). Replies are built
from the official SDK's types (`openai.types.responses`); a `<think>` block of the model's text
is a `reasoning` item, dropped again when sent back, so a tool loop merges into one sample
whether the harness echoes reasoning or not. Sampling is the job's: `temperature`, `top_p` and
`reasoning` are accepted, ignored and counted; a structured `text.format` is answered, not
enforced; `tool_choice` is accepted in every form and never forced (a reply without the
demanded call counts as `tool_choice_unmet`).
Hosted tools (web search, file search, ...) are left out of the prompt and counted as ignored
(`tools.web_search`: Codex offers it by default); a `namespace` tool's functions are offered and
their calls name the namespace. Stored server state (`conversation`, `prompt`, `item_reference`,
`background`) is refused with a 400 naming it: raas keeps only this rollout's responses.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

from agents.harness import openai_wire
from agents.harness.calls import CallRequest, Completion
from agents.harness.messages import check_messages, content_text
from agents.harness.responses_events import LiveResponses, new_id, stream_events
from core.errors import InvalidRequest

log = logging.getLogger(__name__)

IGNORED = ("temperature", "top_p", "top_logprobs", "reasoning")
REFUSED = {
    "background": "background responses are not supported; call it synchronously or with stream",
    "conversation": "stored conversations are not kept; send the whole input (store: false)",
    "prompt": "stored prompt templates are not available; send instructions and input",
}
_STATUS = {"length": "incomplete"}


class ResponsesWire:
    """The route's parser and renderer, with the rollout's responses in memory."""

    def __init__(self) -> None:
        self._histories: dict[str, list[dict[str, Any]]] = {}  # response id -> its conversation
        self._guard = threading.Lock()

    # -- request -------------------------------------------------------------------------
    def parse_request(self, body: dict[str, Any]) -> CallRequest:
        """The call a `/v1/responses` body asks for (InvalidRequest names a bad field)."""
        for name, why in REFUSED.items():
            if body.get(name):
                raise InvalidRequest(f"{name}: {why}")
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidRequest("instructions: a string is required")
        messages = [{"role": "system", "content": instructions}] if instructions else []
        messages += self._previous(body.get("previous_response_id"))
        messages += _Conversation().convert(body.get("input"))
        parse_tools, demanded = _tool_choice(body.get("tool_choice"))
        fmt = ((body.get("text") or {}).get("format") or {}).get("type", "text")
        return CallRequest(
            api="responses",
            messages=check_messages(messages),
            tools=function_tools(body.get("tools")),
            parse_tools=parse_tools,
            require_call=demanded is not None,
            required_name=None if demanded == "*" else demanded,
            single_tool_call=body.get("parallel_tool_calls") is False,
            thinking=True,  # a `<think>` block is always a reasoning item here
            max_tokens=_max_tokens(body.get("max_output_tokens")),
            stream=bool(body.get("stream")),
            ignored=[k for k in IGNORED if body.get(k) is not None] + _hosted(body.get("tools")),
            unenforced=["text.format"] if fmt != "text" else [],
        )

    def _previous(self, response_id: Any) -> list[dict[str, Any]]:
        if response_id is None:
            return []
        with self._guard:
            history = self._histories.get(str(response_id))
        if history is None:
            raise InvalidRequest(
                f"previous_response_id: no response {response_id!r} in this rollout; send the whole input instead"
            )
        return list(history)

    # -- reply ---------------------------------------------------------------------------
    def answer(self, call: CallRequest, c: Completion, body: dict[str, Any], model: str) -> Any:
        """The `Response` (JSON) or its SSE events; the response is remembered for
        `previous_response_id` and its reasoning for the echo."""
        response = self._response(c, body, model)
        self.remember(call, c, body, response)
        return stream_events(response) if call.stream else response.to_dict(mode="json")

    def live(self, call: CallRequest, body: dict[str, Any], model: str) -> LiveResponses:
        """The live event stream of this call (`streaming.WireStream`)."""
        return LiveResponses(self, call, body, model)

    def remember(self, call: CallRequest, c: Completion, body: dict[str, Any], response: Any) -> None:
        """Keep the response's conversation for a later `previous_response_id`."""
        history = call.messages[1:] if body.get("instructions") else list(call.messages)
        with self._guard:
            self._histories[response.id] = history + [_reply_message(c)]

    def _response(self, c: Completion, body: dict[str, Any], model: str) -> Any:
        from openai.types.responses import Response  # 0.8 s to import: on first use only
        from pydantic import ValidationError

        core = {
            "id": f"resp_{secrets.token_hex(16)}",
            "object": "response",
            "created_at": time.time(),
            "model": model,
            "status": _STATUS.get(c.finish, "completed"),
            "incomplete_details": {"reason": "max_output_tokens"} if c.finish == "length" else None,
            "error": None,
            "output": self._output(c, _namespaces(body.get("tools"))),
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
            "tool_choice": "auto",
            "tools": [],
            "usage": _usage(c),
        }
        echo = {k: body.get(k) for k in ("instructions", "previous_response_id", "max_output_tokens", "metadata")}
        echo["tool_choice"] = body.get("tool_choice") or "auto"
        echo["tools"] = [t for t in body.get("tools") or [] if t.get("type") in ("function", "namespace")]
        try:
            return Response(**{**core, **echo})
        except ValidationError as exc:  # an echoed field the SDK's type refuses: the reply without echoes
            log.warning("responses: request fields not echoed (%s)", exc.errors()[0].get("loc"))
            return Response(**core)

    def _output(self, c: Completion, namespaces: dict[str, str]) -> list[Any]:
        """The output items: reasoning, the message, one `function_call` per tool call."""
        from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseReasoningItem

        reasoning, visible = c.reasoning, c.content or ""
        items: list[Any] = []
        if reasoning is not None:
            content = [{"type": "reasoning_text", "text": reasoning}]
            items.append(
                ResponseReasoningItem(
                    id=new_id("rs"), type="reasoning", summary=[], content=content, status="completed"
                )
            )
        if visible or not (c.tool_calls or reasoning is not None):
            part = {"type": "output_text", "text": visible, "annotations": [], "logprobs": []}
            status = _STATUS.get(c.finish, "completed")
            items.append(
                ResponseOutputMessage(id=new_id("msg"), type="message", role="assistant", status=status, content=[part])
            )
        for t in c.tool_calls:
            items.append(
                ResponseFunctionToolCall(
                    id=new_id("fc"),
                    type="function_call",
                    call_id=t.id,
                    name=t.name,
                    arguments=json.dumps(t.arguments, ensure_ascii=False),
                    status="completed",
                    **({"namespace": namespaces[t.name]} if t.name in namespaces else {}),
                )
            )
        return items

    error_body = staticmethod(openai_wire.error_body)  # the same `{"error": {...}}` shape


class _Conversation:
    """Turns a list of input items into messages; a model turn's items become one message.
    Reasoning items sent back are dropped (the turn is what raas answered besides them; the
    template renders raas's own replies from the generated text, reasoning included)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._texts: list[str] = []
        self._calls: list[dict[str, Any]] = []
        self._open = False  # a model turn is being collected

    def convert(self, raw: Any) -> list[dict[str, Any]]:
        """The messages of `input` (a string, or a list of items)."""
        if isinstance(raw, str):
            return [{"role": "user", "content": raw}]
        if not isinstance(raw, list) or not raw:
            raise InvalidRequest("input: a string or a non-empty list of items is required")
        for i, item in enumerate(raw):
            if not isinstance(item, dict):
                raise InvalidRequest(f"input[{i}]: an item object is required")
            self._add(item, f"input[{i}]")
        self._close()
        return self.messages

    def _add(self, item: dict[str, Any], where: str) -> None:
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message" and item.get("role") == "assistant":
            if self._texts or self._calls:
                self._close()  # a second answer: a new model turn
            self._open = True
            self._texts.append(content_text(item.get("content"), where))
        elif kind == "message":
            self._close()
            role = item.get("role")
            if role not in ("user", "system", "developer"):
                raise InvalidRequest(f"{where}: role must be user, assistant, system or developer")
            self.messages.append({"role": role, "content": content_text(item.get("content"), where)})
        elif kind == "reasoning":
            self._close()
            self._open = True
        elif kind == "function_call":
            self._open = True
            self._calls.append(_call(item, where))
        elif kind == "function_call_output":
            self._close()
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output, f"{where}.output")
            self.messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "item_reference":
            raise InvalidRequest(f"{where}: item_reference needs stored items; send the items themselves")
        else:
            raise InvalidRequest(f"{where}: input items of type {kind!r} are not supported")

    def _close(self) -> None:
        if not self._open:
            return
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._texts)}
        if self._calls:
            message["tool_calls"] = self._calls
        self.messages.append(message)
        self._texts, self._calls, self._open = [], [], False


def _usage(c: Completion) -> dict[str, Any]:
    return {
        "input_tokens": c.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": c.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    }


def _call(item: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(item.get("name"), str):
        raise InvalidRequest(f"{where}: a function_call needs a name")
    return {
        "id": item.get("call_id") or item.get("id"),
        "type": "function",
        "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"},
    }


def _reply_message(c: Completion) -> dict[str, Any]:
    """The reply as the assistant message a later `previous_response_id` call extends."""
    message: dict[str, Any] = {"role": "assistant", "content": c.content}
    if c.tool_calls:
        message["tool_calls"] = [
            {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in c.tool_calls
        ]
    return message


def function_tools(tools: Any) -> list[dict[str, Any]] | None:
    """The request's function tools (a `namespace` tool's too) as the template's schemas.

    Hosted tools (`web_search`, `file_search`, ...) are left out: the policy is offered only
    what it can call here (Codex sends `web_search` by default; `_hosted` counts them)."""
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise InvalidRequest("tools: a list of tool objects is required")
    out = []
    for i, (fn, _) in enumerate(_functions(tools)):
        if not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"tools[{i}]: a function tool needs a name")
        schema = {"name": fn["name"], "description": fn.get("description") or ""}
        schema["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": schema})
    return out or None


def _functions(tools: list[Any]) -> Iterator[tuple[dict[str, Any], str | None]]:
    """(function, its namespace) of every function tool, in order; chat-style ones too."""
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "function":
            yield (tool["function"] if isinstance(tool.get("function"), dict) else tool), None
        elif tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict) and inner.get("type") == "function":
                    yield inner, str(tool.get("name"))


def _hosted(tools: Any) -> list[str]:
    """The hosted tools of a request, as `tools.<type>` (ignored and counted)."""
    if not isinstance(tools, list):
        return []
    kinds = {str(t.get("type")) for t in tools if isinstance(t, dict)} - {"function", "namespace"}
    return [f"tools.{kind}" for kind in sorted(kinds)]


def _namespaces(tools: Any) -> dict[str, str]:
    """Function name -> the `namespace` tool it came in (its calls name it, as the API's do)."""
    if not isinstance(tools, list):
        return {}
    return {str(fn.get("name")): space for fn, space in _functions(tools) if space is not None}


def _tool_choice(choice: Any) -> tuple[bool, str | None]:
    """(parse tool calls, the demanded tool): every form the API takes, none of them forced."""
    if choice in (None, "auto"):
        return True, None
    if choice == "none":
        return False, None
    if choice == "required":
        return True, "*"
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return True, choice["name"]
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return True, "*" if choice.get("mode") == "required" else None
    raise InvalidRequest(f"tool_choice {choice!r} is not supported: use auto, none, required or a function by name")


def _max_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"max_output_tokens must be a positive integer (got {value!r})")
    return value
