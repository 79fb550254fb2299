"""The Responses API's event streams (`responses_wire`'s `stream: true` answers): a whole
response's events, and `LiveResponses`, whose text goes out as it is generated.

Every event is validated against the official SDK's `ResponseStreamEvent` union (its
`sequence_number` counting from 0), so what a harness parses is what the SDK accepts.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

from agents.harness.calls import CallRequest, Completion


def new_id(prefix: str) -> str:
    """A new output item (or response) id: `msg_...`, `fc_...`, `rs_...`."""
    return f"{prefix}_{secrets.token_hex(16)}"


class LiveResponses:
    """A response's events as its text is generated: `response.created`, `in_progress`, the
    message item and its `output_text` part opened with the first text, a delta per piece; at
    the end the text's `done` events, the other items (function calls) and
    `response.completed` (or `incomplete`) with the whole response, whose id, creation time
    and message id are the ones the opening events announced."""

    def __init__(self, wire: Any, call: CallRequest, body: dict[str, Any], model: str) -> None:
        self.wire, self.call, self.body, self.model = wire, call, body, model
        self.id, self.msg_id, self.created = f"resp_{secrets.token_hex(16)}", new_id("msg"), time.time()
        self.count = 0  # sequence_number of the next event
        self.sent = ""

    def _event(self, event: dict[str, Any]) -> str:
        data = _event_adapter().validate_python({**event, "sequence_number": self.count})
        self.count += 1
        data = data.to_dict(mode="json")
        return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def head(self, prompt_tokens: int) -> Iterator[str]:
        blank = self.wire._response(Completion("", "", [], "stop", prompt_tokens, 0), self.body, self.model)
        opening = {**blank.to_dict(mode="json"), "id": self.id, "created_at": self.created, "status": "in_progress"}
        opening.update(output=[], usage=None, incomplete_details=None)
        yield self._event({"type": "response.created", "response": opening})
        yield self._event({"type": "response.in_progress", "response": opening})
        item = {"id": self.msg_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        yield self._event({"type": "response.output_item.added", "output_index": 0, "item": item})
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield self._event({"type": "response.content_part.added", **self._at(), "content_index": 0, "part": part})

    def _at(self) -> dict[str, Any]:
        return {"output_index": 0, "item_id": self.msg_id}

    def text(self, delta: str) -> Iterator[str]:
        self.sent += delta
        at = {**self._at(), "content_index": 0, "logprobs": []}
        yield self._event({"type": "response.output_text.delta", **at, "delta": delta})

    def tail(self, c: Completion, rest: str) -> Iterator[str]:
        if rest:
            yield from self.text(rest)
        response = self.wire._response(c, self.body, self.model).model_copy(
            update={"id": self.id, "created_at": self.created}
        )
        self.wire.remember(self.call, c, self.body, response)
        whole = response.to_dict(mode="json")
        message = next((item for item in whole["output"] if item["type"] == "message"), None)
        if message is None:  # a mismatch (see `streaming.ReplyStream.rest`): close what was opened
            part = {"type": "output_text", "text": self.sent, "annotations": [], "logprobs": []}
            message = {"type": "message", "role": "assistant", "status": "completed", "content": [part]}
        message["id"] = self.msg_id
        part = message["content"][0]
        at = {**self._at(), "content_index": 0}
        yield self._event({"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []})
        yield self._event({"type": "response.content_part.done", **at, "part": part})
        yield self._event({"type": "response.output_item.done", "output_index": 0, "item": message})
        others = [item for item in whole["output"] if item is not message]
        for index, item in enumerate(others, 1):
            for event in _item_events(index, item):
                yield self._event(event)
        yield self._event({"type": f"response.{whole['status']}", "response": whole})

    def error(self, body: dict[str, Any]) -> Iterator[str]:
        error = body["error"]
        yield self._event({"type": "error", "code": error.get("code"), "message": error["message"], "param": None})


@functools.lru_cache(maxsize=1)
def _event_adapter() -> Any:
    """The validator of the SDK's stream events (building it takes milliseconds)."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    return TypeAdapter(ResponseStreamEvent)


def stream_events(response: Any) -> Iterator[str]:
    """The SSE of a streamed response, in the API's order (`sequence_number` counts from 0)."""
    events = _event_adapter()
    for n, event in enumerate(_event_dicts(response)):
        data = events.validate_python({**event, "sequence_number": n}).to_dict(mode="json")
        yield f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _event_dicts(response: Any) -> Iterator[dict[str, Any]]:
    whole = response.to_dict(mode="json")
    opening = {**whole, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield {"type": "response.created", "response": opening}
    yield {"type": "response.in_progress", "response": opening}
    for index, item in enumerate(whole["output"]):
        yield from _item_events(index, item)
    yield {"type": f"response.{whole['status']}", "response": whole}


def _item_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """added, the content's parts and deltas, done: one output item."""
    at = {"output_index": index, "item_id": item["id"]}
    kind = item["type"]
    if kind == "function_call":
        opened = {**item, "arguments": "", "status": "in_progress"}
        yield {"type": "response.output_item.added", "output_index": index, "item": opened}
        yield {"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]}
        yield {"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"]}
    else:
        step = "reasoning_text" if kind == "reasoning" else "output_text"
        opened = {**item, "content": [], "status": "in_progress"}
        yield {"type": "response.output_item.added", "output_index": index, "item": opened}
        message = kind == "message"  # reasoning text has no content_part events (older SDKs refuse them)
        for i, part in enumerate(item.get("content") or []):
            extra = {"logprobs": []} if message else {}
            if message:
                yield {"type": "response.content_part.added", **at, "content_index": i, "part": {**part, "text": ""}}
            yield {"type": f"response.{step}.delta", **at, "content_index": i, "delta": part["text"], **extra}
            yield {"type": f"response.{step}.done", **at, "content_index": i, "text": part["text"], **extra}
            if message:
                yield {"type": "response.content_part.done", **at, "content_index": i, "part": part}
    yield {"type": "response.output_item.done", "output_index": index, "item": item}
