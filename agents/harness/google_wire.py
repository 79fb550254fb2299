"""Google's generateContent wire: `.../models/{model}:generateContent` and
`:streamGenerateContent` -> `CallRequest`, `Completion` -> a `GenerateContentResponse`.

What the Gemini CLI and `google-genai` clients send: `contents` (role `user` / `model`; parts
`text`, `functionCall`, `functionResponse`, `thought` text), `systemInstruction`,
`tools[].functionDeclarations` (`parameters` or `parametersJsonSchema`), `toolConfig`
(AUTO / ANY / NONE with `allowedFunctionNames`: accepted, never forced; a reply without the
demanded call counts as `tool_choice_unmet`) and `generationConfig` (`maxOutputTokens` caps the
call; `stopSequences` are honoured; sampling fields and `thinkingConfig` are the job's:
accepted, ignored and counted, and so are Google's own tools, `googleSearch` and the like, which
are left out of the prompt; structured output is answered, not enforced). The path's prefix is
whatever the client's base URL makes of it (`/v1beta/models/...`, `/v1/models/...`,
`/models/...`): the route matches on `models/{model}:`.
Streaming is `?alt=sse` (`data: {...}` chunks) or, without it, one JSON array of the chunks.

Replies are camelCase JSON as the API sends it; the shapes are those of `google.genai.types`
(the tests validate every reply against them, whose models forbid unknown fields). They are
not built from that package at run time because it would bring google-auth, cryptography and
websockets into every worker. A model's `<think>` block is a `thought` part when the request
asked for thoughts (`thinkingConfig.includeThoughts`), never answer text, and thought parts sent
back are dropped: the turn merges whether the client keeps its thoughts or not (the Gemini CLI
keeps none in its history).
"""

from __future__ import annotations

import json
import re
import secrets
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agents.harness.calls import CallError, CallRequest, Completion
from agents.harness.messages import check_messages
from core.errors import InvalidRequest

_ROUTE = re.compile(r"/models/(?P<model>[^/:]+):(?P<method>generateContent|streamGenerateContent)$")
IGNORED = ("temperature", "topP", "topK", "seed", "presencePenalty", "frequencyPenalty", "thinkingConfig")
UNENFORCED = ("responseSchema", "responseJsonSchema", "responseLogprobs", "logprobs")
_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    413: "INVALID_ARGUMENT",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


class GoogleWire:
    """Matches Google's routes."""

    def route(self, raw_path: str) -> GoogleRoute | None:
        """The route a request path names (None when it is not one of Google's)."""
        parts = urllib.parse.urlsplit(raw_path)
        found = _ROUTE.search(parts.path.rstrip("/"))
        if found is None:
            return None
        sse = urllib.parse.parse_qs(parts.query).get("alt") == ["sse"]
        stream = found["method"] == "streamGenerateContent"
        return GoogleRoute(found["model"], stream, sse)


@dataclass
class GoogleRoute:
    """One request's route: the model named in its path and how it streams."""

    model: str
    stream: bool  # `:streamGenerateContent`
    sse: bool  # `?alt=sse` (else a streamed answer is one JSON array)

    def parse_request(self, body: dict[str, Any]) -> CallRequest:
        """The call a generateContent body asks for (InvalidRequest names a bad field)."""
        if _f(body, "cachedContent"):
            raise InvalidRequest("cachedContent: cached contents are not kept; send the whole contents")
        config = _f(body, "generationConfig") or {}
        if _f(config, "candidateCount") not in (None, 1):
            raise InvalidRequest("generationConfig.candidateCount: only 1 is supported; send one request per sample")
        messages = _system(_f(body, "systemInstruction"))
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise InvalidRequest("contents: a non-empty list is required")
        for i, content in enumerate(contents):
            messages += _convert(content, f"contents[{i}]")
        parse_tools, demanded = _tool_config(_f(body, "toolConfig"))
        return CallRequest(
            api="google",
            messages=check_messages(messages),
            tools=_tools(body.get("tools")),
            parse_tools=parse_tools,
            require_call=demanded is not None,
            required_name=None if demanded == "*" else demanded,
            stop=_stop(_f(config, "stopSequences")),
            thinking=True,  # a `<think>` block is a thought part (when asked for), never text
            max_tokens=_max_tokens(_f(config, "maxOutputTokens")),
            stream=self.stream and self.sse,  # SSE; a plain stream is one JSON answer
            ignored=[k for k in IGNORED if _f(config, k) is not None] + _hosted(body.get("tools")),
            unenforced=_unenforced(config),
        )

    def answer(self, call: CallRequest, c: Completion, body: dict[str, Any], model: str) -> Any:
        """The response (JSON), its SSE chunks, or the JSON array of a stream without SSE."""
        thoughts = bool(_f(_f(_f(body, "generationConfig"), "thinkingConfig"), "includeThoughts"))
        parts = self._parts(c, thoughts)
        head = {"modelVersion": self.model, "responseId": secrets.token_hex(12)}
        last = {"finishReason": _FINISH[c.finish], "index": 0}
        usage = {
            "usageMetadata": {
                "promptTokenCount": c.prompt_tokens,
                "candidatesTokenCount": c.completion_tokens,
                "totalTokenCount": c.prompt_tokens + c.completion_tokens,
            }
        }
        if not self.stream:
            return {"candidates": [{"content": {"role": "model", "parts": parts}, **last}], **usage, **head}
        chunks = [
            {"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}], **head} for part in parts
        ]
        chunks[-1]["candidates"][0].update(last)
        chunks[-1].update(usage)
        return (f"data: {json.dumps(chunk, ensure_ascii=False)}\r\n\r\n" for chunk in chunks) if self.sse else chunks

    def live(self, call: CallRequest, body: dict[str, Any], model: str) -> LiveGoogle:
        """The live SSE of this call (`streaming.WireStream`)."""
        return LiveGoogle(self, body)

    def _parts(self, c: Completion, thoughts: bool) -> list[dict[str, Any]]:
        reasoning, visible = c.reasoning, c.content or ""
        parts: list[dict[str, Any]] = [{"text": reasoning, "thought": True}] if thoughts and reasoning else []
        if visible or not c.tool_calls:
            parts.append({"text": visible})
        parts += [{"functionCall": {"id": t.id, "name": t.name, "args": t.arguments}} for t in c.tool_calls]
        return parts

    @staticmethod
    def error_body(exc: CallError) -> dict[str, Any]:
        """Google's error object (see `error_body`)."""
        return error_body(exc)


class LiveGoogle:
    """`streamGenerateContent?alt=sse` as the text is generated: a chunk per piece of text,
    then the rest of the answer's parts (thought, function calls) and the last chunk's
    `finishReason` and `usageMetadata`, as `GoogleRoute.answer` streams a whole reply."""

    def __init__(self, route: GoogleRoute, body: dict[str, Any]) -> None:
        self.route = route
        self.body = body
        self.head_fields = {"modelVersion": route.model, "responseId": secrets.token_hex(12)}

    def _chunk(self, parts: list[dict[str, Any]]) -> str:
        chunk = {"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}], **self.head_fields}
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\r\n\r\n"

    def head(self, prompt_tokens: int) -> list[str]:
        return []

    def text(self, delta: str) -> list[str]:
        return [self._chunk([{"text": delta}])]

    def tail(self, c: Completion, rest: str) -> Iterator[str]:
        thoughts = bool(_f(_f(_f(self.body, "generationConfig"), "thinkingConfig"), "includeThoughts"))
        parts = [p for p in self.route._parts(c, thoughts) if "text" not in p or p.get("thought")]
        if rest or not parts:
            parts.insert(0, {"text": rest})  # the last chunk carries the finish: never empty
        chunks = [
            {"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}], **self.head_fields}
            for part in parts
        ]
        chunks[-1]["candidates"][0].update({"finishReason": _FINISH[c.finish], "index": 0})
        chunks[-1]["usageMetadata"] = {
            "promptTokenCount": c.prompt_tokens,
            "candidatesTokenCount": c.completion_tokens,
            "totalTokenCount": c.prompt_tokens + c.completion_tokens,
        }
        for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\r\n\r\n"

    def error(self, body: dict[str, Any]) -> list[str]:
        return [f"data: {json.dumps(body, ensure_ascii=False)}\r\n\r\n"]


def _f(obj: Any, name: str) -> Any:
    """Field `name` of a request object, in lowerCamelCase or snake_case: Google's JSON parser
    takes both, and clients send both (google-genai passes `thinkingConfig` on as written)."""
    if not isinstance(obj, dict):
        return None
    value = obj.get(name)
    return value if value is not None else obj.get(re.sub(r"([A-Z])", r"_\1", name).lower())


def _system(instruction: Any) -> list[dict[str, Any]]:
    if not instruction:
        return []
    if isinstance(instruction, str):
        return [{"role": "system", "content": instruction}]
    parts = instruction.get("parts") if isinstance(instruction, dict) else None
    if not isinstance(parts, list):
        raise InvalidRequest("systemInstruction: a content with text parts is required")
    return [{"role": "system", "content": "".join(_text(p, "systemInstruction") for p in parts)}]


def _text(part: Any, where: str) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("text"), str):
        kinds = ", ".join(part) if isinstance(part, dict) else type(part).__name__
        raise InvalidRequest(f"{where}: parts of kind {kinds} are not supported here (text only)")
    return part["text"]


def _convert(content: Any, where: str) -> list[dict[str, Any]]:
    """One Google content as OpenAI-style messages."""
    if not isinstance(content, dict) or not isinstance(content.get("parts"), list):
        raise InvalidRequest(f"{where}: a content with a list of parts is required")
    role = content.get("role") or "user"
    if role == "model":
        return [_model_turn(content["parts"], where)]
    if role not in ("user", "function"):
        raise InvalidRequest(f"{where}: role must be user or model")
    results, texts = [], []
    for i, part in enumerate(content["parts"]):
        if _f(part, "functionResponse") is not None:
            results.append(_result(_f(part, "functionResponse"), f"{where}.parts[{i}]"))
        elif not (isinstance(part, dict) and part.get("thought")):
            texts.append(_text(part, f"{where}.parts[{i}]"))
    return results + ([{"role": "user", "content": "".join(texts)}] if texts else [])


def _model_turn(parts: list[Any], where: str) -> dict[str, Any]:
    """A model turn as an assistant message; thought parts are dropped (see the docstring)."""
    texts, calls = [], []
    for i, part in enumerate(parts):
        if _f(part, "functionCall") is not None:
            call = _f(part, "functionCall")
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise InvalidRequest(f"{where}.parts[{i}]: a functionCall needs a name")
            args = call.get("args") or {}
            calls.append(
                {"id": call.get("id"), "type": "function", "function": {"name": call["name"], "arguments": args}}
            )
        elif not (isinstance(part, dict) and part.get("thought")):
            texts.append(_text(part, f"{where}.parts[{i}]"))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _result(response: Any, where: str) -> dict[str, Any]:
    """A `functionResponse` as a tool message (a lone output/result string is the text)."""
    if not isinstance(response, dict) or not isinstance(response.get("name"), str):
        raise InvalidRequest(f"{where}: a functionResponse needs a name")
    value = response.get("response")
    if isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())), str):
        text = next(iter(value.values()))
        text = f"Error: {text}" if "error" in value else text
    else:
        text = json.dumps(value, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": response.get("id") or response["name"], "content": text}


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """`functionDeclarations` as the template's function schemas. Google's own tools
    (`googleSearch`, `codeExecution`, ...) are left out: the policy is offered only what it can
    call here (`_hosted` counts them as ignored)."""
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise InvalidRequest("tools: a list of tool objects is required")
    out = []
    for i, decl in enumerate(d for t in tools for d in _f(t, "functionDeclarations") or []):
        if not isinstance(decl, dict) or not isinstance(decl.get("name"), str):
            raise InvalidRequest(f"tools: functionDeclarations[{i}] needs a name")
        schema = _f(decl, "parametersJsonSchema") or _json_schema(decl.get("parameters"))
        out.append(
            {
                "type": "function",
                "function": {
                    "name": decl["name"],
                    "description": decl.get("description") or "",
                    "parameters": schema or {"type": "object", "properties": {}},
                },
            }
        )
    return out or None


def _json_schema(schema: Any) -> Any:
    """Google's OpenAPI-style `Schema` as JSON Schema (its type names are upper case)."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _json_schema(v) for k, v in schema.items()}
    if isinstance(out.get("type"), str):
        out["type"] = out["type"].lower()
    return out


def _tool_config(config: Any) -> tuple[bool, str | None]:
    """(parse tool calls, the demanded tool) of `toolConfig.functionCallingConfig`."""
    calling = _f(config, "functionCallingConfig") or {}
    mode = str(calling.get("mode") or "AUTO").upper()
    if mode == "NONE":
        return False, None
    if mode == "ANY":
        allowed = _f(calling, "allowedFunctionNames") or []
        return True, allowed[0] if len(allowed) == 1 else "*"
    if mode in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        return True, None
    raise InvalidRequest(f"toolConfig.functionCallingConfig.mode {mode!r} is not supported: use AUTO, ANY or NONE")


def _max_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"generationConfig.maxOutputTokens must be a positive integer (got {value!r})")
    return value


def _unenforced(config: dict[str, Any]) -> list[str]:
    """Structured output and logprobs: answered as sampled, not enforced (no forced decoding)."""
    unenforced = [k for k in UNENFORCED if _f(config, k) is not None]
    mime = _f(config, "responseMimeType")
    return unenforced + (["responseMimeType"] if mime not in (None, "text/plain") else [])


def _stop(value: Any) -> list[str]:
    """`stopSequences`: honoured (sent to the server; the reply's text ends before the match)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest("generationConfig.stopSequences: a list of strings is required")
    return [v for v in value if v]


def _hosted(tools: Any) -> list[str]:
    """Google's own tools in a request, as `tools.<kind>` (camelCase)."""
    if not isinstance(tools, list):
        return []
    kinds = {k for t in tools if isinstance(t, dict) for k in t} - {"functionDeclarations", "function_declarations"}
    return sorted(f"tools.{re.sub(r'_([a-z])', lambda m: m[1].upper(), k)}" for k in kinds)


def error_body(exc: CallError) -> dict[str, Any]:
    """Google's `{"error": {"code", "message", "status"}}`; a context overflow in its words."""
    message = exc.message
    if exc.kind == "context_length_exceeded":
        message = (
            f"The input token count ({exc.details.get('prompt_tokens')}) exceeds the maximum number "
            f"of tokens allowed ({exc.details.get('limit')})."
        )
    return {"error": {"code": exc.status, "message": message, "status": _STATUS.get(exc.status, "INVALID_ARGUMENT")}}
