"""Parse Hermes/Qwen tool calls out of a model turn: `<tool_call>{"name", "arguments"}</tool_call>`.

Several calls per turn are allowed. A malformed call is not an exception: it becomes an error
message that the agent loop sends back to the model as an observation (and counts in the
rollout's metrics), because a policy under RL must learn from its formatting mistakes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN_TAG) + r"(.*?)(?:" + re.escape(CLOSE_TAG) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form, as stored in `Turn.tool_calls`."""
        return {"name": self.name, "arguments": self.arguments}


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """All well-formed calls in `text`, in order, and one error message per malformed call."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    for index, match in enumerate(_BLOCK.finditer(text)):
        closed = match.group(0).endswith(CLOSE_TAG)
        body = match.group(1).strip()
        call, error = _parse_one(body, closed)
        if call is not None:
            calls.append(call)
        else:
            errors.append(f"tool call #{index + 1}: {error}")
    return calls, errors


def _parse_one(body: str, closed: bool) -> tuple[ToolCall | None, str | None]:
    """A ToolCall from the JSON between the tags, or the reason it is not one."""
    if not closed:
        return None, f"missing {CLOSE_TAG}"
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(payload, dict):
        return None, 'expected a JSON object {"name": ..., "arguments": {...}}'
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, 'missing "name" (a non-empty string)'
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        # Some models emit the arguments as a JSON-encoded string (OpenAI style).
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None, f'"arguments" of {name!r} is a string that is not JSON'
    if not isinstance(arguments, dict):
        return None, f'"arguments" of {name!r} must be a JSON object'
    return ToolCall(name=name.strip(), arguments=arguments), None
