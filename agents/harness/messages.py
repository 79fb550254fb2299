"""A harness's chat messages, in one internal form, compared and rendered the way raas needs.

Both APIs arrive here as OpenAI-style messages (the Anthropic route converts first). Two views
of each message matter:

- the *canonical* form, for deciding whether a request extends the previous one: it keeps
  only what the model would see and forgets the harmless normalisations SDKs make (content
  `None` vs `""` vs a list of text parts, tool-call ids, JSON argument spacing and key order);
- the *template* form, what the chat template renders: an assistant message raas generated
  itself is rendered from the text the model produced (never re-serialised from the
  harness's echo); anything else from its own fields.
"""

from __future__ import annotations

import json
from typing import Any

from core.errors import InvalidRequest

ROLES = ("system", "developer", "user", "assistant", "tool")


def content_text(content: Any, where: str) -> str:
    """The text of an OpenAI `content` (None, a string or a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "input_text", "output_text"):
                raise InvalidRequest(f"{where}: content part of type {kind!r} is not supported (text only)")
            parts.append(str(part.get("text") or ""))
        return "".join(parts)
    raise InvalidRequest(f"{where}: content must be a string, null or a list of text parts")


def arguments_of(raw: Any) -> Any:
    """Tool-call arguments as a value: a JSON string is parsed (spacing is not meaning)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw
    return raw if raw is not None else {}


def canonical(message: dict[str, Any]) -> dict[str, Any]:
    """What of `message` a prefix comparison looks at (see the module docstring)."""
    role = message.get("role")
    role = "system" if role == "developer" else role
    out: dict[str, Any] = {"role": role, "content": content_text(message.get("content"), f"{role} message")}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            [(c.get("function") or {}).get("name"), arguments_of((c.get("function") or {}).get("arguments"))]
            for c in calls
        ]
    return out


def key(message: dict[str, Any]) -> str:
    """A string that is equal for two messages exactly when their canonical forms are."""
    return json.dumps(canonical(message), sort_keys=True, ensure_ascii=False)


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages, each a dict with a known role; else InvalidRequest naming it."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: a non-empty list is required")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise InvalidRequest(f"messages[{i}]: role must be one of {', '.join(ROLES)}")
        content_text(message.get("content"), f"messages[{i}]")
    if messages[-1].get("role") == "assistant":
        raise InvalidRequest(
            "messages: the last message is an assistant message; continuing a prefilled assistant turn is not supported"
        )
    return messages


def template_message(message: dict[str, Any], generated: dict[str, str]) -> dict[str, Any]:
    """The message as the chat template gets it; `generated` maps the key of each assistant
    reply raas returned to the text the model produced for it."""
    role = message.get("role")
    text = content_text(message.get("content"), f"{role} message")
    if role == "assistant":
        raw = generated.get(key(message))
        if raw is not None:
            return {"role": "assistant", "content": raw}
        out: dict[str, Any] = {"role": "assistant", "content": text}
        calls = [
            {
                "type": "function",
                "function": {
                    "name": (c.get("function") or {}).get("name"),
                    "arguments": arguments_of((c.get("function") or {}).get("arguments")),
                },
            }
            for c in message.get("tool_calls") or []
        ]
        if calls:
            out["tool_calls"] = calls
        return out
    if role == "tool":
        out = {"role": "tool", "content": text}
        if message.get("name"):
            out["name"] = message["name"]
        return out
    return {"role": "system" if role == "developer" else role, "content": text}


def function_tools(tools: Any) -> list[dict[str, Any]] | None:
    """The request's `tools` as the template's function schemas (None when there are none)."""
    if not tools:
        return None
    if not isinstance(tools, list):
        raise InvalidRequest("tools: a list of function tools is required")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
        ):
            raise InvalidRequest(
                f'tools[{i}]: only function tools {{"type": "function", "function": {{"name": ...}}}} are supported'
            )
        out.append({"type": "function", "function": fn})
    return out
