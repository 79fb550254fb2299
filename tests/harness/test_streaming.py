"""Live streaming through the endpoint: the official `openai` and `anthropic` SDKs over real
HTTP on the Unix socket, the LLM simulator (named fake of vLLM) streaming token by token with
its latency spread over the tokens, the real SmolLM2 tokenizer.

What must hold: the text reaches the harness while the server is still generating; tool-call
markup and stop strings never leak as text; the final events are a whole reply's; the recorded
turn is exactly a non-streamed call's; the time to first token is measured and counted."""

from __future__ import annotations

import json
import time

import pytest

from agents.harness.streaming import ReplyStream
from tests.harness.conftest import BASH_TOOL, anthropic_client, ids_of, openai_client, recorded, uds_client

END = 2
TEXT = "I will list the files in the working directory first, then read the one that fails."
CALL = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>'
LATENCY = 2.0  # spread over the reply's tokens: the first arrives long before the last


def assert_live(started: float, times: list[float]) -> None:
    """The text reached the client while the server was still generating. The simulator
    never sends its last token before `LATENCY` has passed since the request (token i at
    `i + 1` n-ths of it), so a piece that arrives earlier than that was forwarded live, however
    loaded the machine: load only delays pieces, which can fail this, never fake it."""
    assert len(times) > 5 and times[0] - started < LATENCY, [round(t - started, 3) for t in times]


SCRIPT = {"by_instance": {"i-1": [TEXT + "\n" + CALL, "The bug is fixed."]}, "latency": LATENCY}
START = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Task i-1: fix it."}]


def stream_chat(client, messages, **kwargs) -> tuple[list[tuple[float, str]], dict, str, float]:
    """(timed content pieces, tool calls by index, finish reason, when the stream ended)."""
    pieces, calls, finish = [], {}, None
    for chunk in client.chat.completions.create(
        model="policy", messages=messages, tools=[BASH_TOOL], stream=True, **kwargs
    ):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.delta.content:
            pieces.append((time.monotonic(), choice.delta.content))
        for tc in choice.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            slot["name"] = tc.function.name or slot["name"]
            slot["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    return pieces, calls, finish, time.monotonic()


def comparable(turn: dict) -> dict:
    """A recorded turn without what differs between two runs (timings, the stream flag, the
    tool calls' random ids)."""
    extra = {k: v for k, v in turn["extra"].items() if k not in ("stream", "ttft_ms", "tool_call_ids")}
    kept = ("generated_ids", "logprobs", "text", "tool_calls", "finish_reason", "weight_version")
    return {**{k: turn[k] for k in kept}, "extra": extra}


def test_chat_text_streams_live_and_the_record_is_a_whole_call_s(endpoint) -> None:
    runs = {}
    for stream in (False, True):
        ep = endpoint(SCRIPT)
        client = openai_client(ep)
        started = time.monotonic()
        if stream:
            pieces, calls, finish, _ended = stream_chat(client, START)
            content = "".join(text for _, text in pieces)
            # Live: many pieces, spread over the generation.
            assert_live(started, [when for when, _ in pieces])
            ttft = recorded(ep)[0]["extra"]["ttft_ms"]
            assert 0 < ttft < (pieces[0][0] - started) * 1000 + 1
            assert ep.counters.streamed_calls == 1 and ep.counters.ttft_ms_p50 == ttft
        else:
            reply = client.chat.completions.create(model="policy", messages=START, tools=[BASH_TOOL])
            message, finish = reply.choices[0].message, reply.choices[0].finish_reason
            content = message.content
            calls = {
                0: {"name": message.tool_calls[0].function.name, "arguments": message.tool_calls[0].function.arguments}
            }
        assert content == TEXT and "<" not in content  # the markup never leaks as text
        assert finish == "tool_calls" and calls[0]["name"] == "bash"
        assert json.loads(calls[0]["arguments"]) == {"cmd": "ls -la"}
        result = ep.result("completed", "harness_exit")
        runs[stream] = ([comparable(t) for t in recorded(ep)], result.response_ids, result.response_logprobs)
        assert ep.counters.stream_mismatches == 0
    assert runs[True] == runs[False]
    assert runs[True][0][0]["generated_ids"] == ids_of(TEXT + "\n" + CALL) + [END]


def test_a_stop_string_is_never_streamed(endpoint) -> None:
    ep = endpoint({"by_instance": {"i-1": ["Step one. Observation: it works. More text."]}, "latency": 0.3})
    pieces, _, finish, _ = stream_chat(openai_client(ep), START, stop=["Observation:"])
    assert "".join(t for _, t in pieces) == "Step one. " and finish == "stop"  # as a whole reply: cut, not stripped
    (turn,) = recorded(ep)
    assert turn["extra"]["stop_sequence"] == "Observation:"
    assert turn["text"].startswith("Step one. Observation:")  # the ids keep what was sampled


def test_usage_and_logprobs_come_with_the_final_chunks(endpoint) -> None:
    ep = endpoint({"by_instance": {"i-1": ["The bug is fixed in the parser module now."]}, "latency": 0.3})
    chunks = list(
        openai_client(ep).chat.completions.create(
            model="policy", messages=START, stream=True, logprobs=True, stream_options={"include_usage": True}
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    logprobs = [lp for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert content == "The bug is fixed in the parser module now."
    (turn,) = recorded(ep)
    assert [lp.logprob for lp in logprobs] == turn["logprobs"]
    assert chunks[-1].usage.completion_tokens == len(turn["generated_ids"])


def test_anthropic_text_streams_live_then_the_tool_use_block(endpoint) -> None:
    runs = {}
    for stream in (False, True):
        ep = endpoint(SCRIPT)
        client = anthropic_client(ep)
        kwargs = {
            "model": "policy",
            "max_tokens": 300,
            "system": "You fix bugs.",
            "messages": [{"role": "user", "content": "Task i-1: fix it."}],
            "tools": [{"name": "bash", "description": "Run", "input_schema": BASH_TOOL["function"]["parameters"]}],
        }
        if stream:
            started, times = time.monotonic(), []
            with client.messages.stream(**kwargs) as events:
                for _ in events.text_stream:
                    times.append(time.monotonic())
                message = events.get_final_message()
            assert_live(started, times)
        else:
            message = client.messages.create(**kwargs)
        text, tool = message.content
        assert text.type == "text" and text.text == TEXT
        assert tool.type == "tool_use" and tool.name == "bash" and tool.input == {"cmd": "ls -la"}
        assert message.stop_reason == "tool_use" and message.usage.output_tokens == len(ids_of(TEXT + "\n" + CALL)) + 1
        runs[stream] = [comparable(t) for t in recorded(ep)]
    assert runs[True] == runs[False]


def test_a_failure_after_text_ends_the_stream_with_the_api_s_error(endpoint) -> None:
    # The rollout is cancelled while the reply streams: the SDK raises on the error event.
    import openai

    cancelled = []
    ep = endpoint(SCRIPT, cancel_check=lambda: bool(cancelled))
    stream = openai_client(ep).chat.completions.create(model="policy", messages=START, stream=True)
    with pytest.raises(openai.APIError):
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                cancelled.append(True)
    assert ep.counters.errors == {"cancelled": 1}


SLOW_START = {"default": [{"text": "Hello there.", "latency": 3.0}]}  # ~4 tokens: the first at ~0.75 s


def test_the_head_goes_out_when_the_server_accepts_not_with_the_first_text(endpoint) -> None:
    """The harness parses the reply's HTTP head while the model prefills (off the first
    token's path); the wire's opening events still come with the first text."""
    ep = endpoint(SLOW_START)
    body = {"model": "policy", "messages": START, "stream": True}
    headers = {"Authorization": f"Bearer {ep.token}"}
    with uds_client(ep) as http:
        started = time.monotonic()
        with http.stream("POST", "http://endpoint/v1/chat/completions", json=body, headers=headers) as response:
            head_at = time.monotonic()
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            first_at = time.monotonic()
            rest = [line for line in lines if line.startswith("data:")]
    # the server paces its first token ~0.75 s after accepting: the head did not wait for it
    assert first_at - head_at > 0.3, (round(head_at - started, 3), round(first_at - started, 3))
    assert json.loads(first[5:])["choices"][0]["delta"]["role"] == "assistant"  # the opening event
    assert rest[-1] == "data: [DONE]"
    texts = [json.loads(line[5:])["choices"][0]["delta"].get("content") for line in rest[:-1]]
    assert "".join(t for t in texts if t) == "Hello there."


def test_a_failure_after_the_server_accepted_but_before_any_text_is_the_api_s_error_event(endpoint) -> None:
    """The head is out (200): the failure comes as the wire's error event, as the real APIs
    send one once their stream is open; the SDKs raise on it."""
    import anthropic
    import openai

    cancelled = []
    ep = endpoint(SLOW_START, cancel_check=lambda: bool(cancelled))
    stream = openai_client(ep).chat.completions.create(model="policy", messages=START, stream=True)
    cancelled.append(True)  # the head is in (create returned); the first token is ~0.75 s away
    with pytest.raises(openai.APIError) as err:
        for _ in stream:
            pass
    assert not isinstance(err.value, openai.APIStatusError)  # an event, not a status

    cancelled_too = []
    ep2 = endpoint(SLOW_START, cancel_check=lambda: bool(cancelled_too))
    with pytest.raises(anthropic.APIError) as err2:
        with anthropic_client(ep2).messages.stream(model="policy", max_tokens=64, messages=START[1:]) as events:
            cancelled_too.append(True)  # the head is in
            for _ in events:
                pass
    assert err2.value.status_code == 200  # the SDK's error from the stream's `error` event
    assert ep2.counters.errors == {"cancelled": 1}
    assert ep.counters.errors == {"cancelled": 1}


@pytest.mark.parametrize(
    ("pieces", "shown"),
    [
        (["Hello", " wor", "ld <tool", "_call>{}"], ["Hello", " wor", "ld"]),
        (["Done. Obs", "ervation: x"], ["Done."]),
        (["  leading space", " held"], []),  # the reply may be stripped: nothing early
        (["a <tool_cal", "l_like"], ["a", " <tool_call_like"]),
    ],
)
def test_the_filter_holds_back_what_the_reply_may_not_contain(pieces, shown) -> None:
    out = []
    stream = ReplyStream(["Observation:"], parse_tools=True, thinking=False, emit=lambda t, _n: out.append(t))
    for piece in pieces:
        stream.delta(piece)
    assert out == shown


def test_responses_and_google_stream_live_too(endpoint) -> None:
    from google import genai
    from google.genai import types

    from tests.harness.conftest import uds_client

    from agents.harness import responses_events

    responses_events._event_adapter()  # warm: the SDK's types take ~1 s to import, once
    tools = [{"type": "function", "name": "bash", "parameters": BASH_TOOL["function"]["parameters"]}]
    ep = endpoint(SCRIPT)
    started, times, events = time.monotonic(), [], []
    for event in openai_client(ep).responses.create(
        model="policy", instructions="You fix bugs.", input="Task i-1: fix it.", tools=tools, stream=True
    ):
        events.append(event)
        if event.type == "response.output_text.delta":
            times.append(time.monotonic())
    assert_live(started, times)
    done = events[-1].response
    assert [o.type for o in done.output] == ["message", "function_call"]
    assert done.output[0].content[0].text == TEXT and json.loads(done.output[1].arguments) == {"cmd": "ls -la"}
    assert recorded(ep)[0]["generated_ids"] == ids_of(TEXT + "\n" + CALL) + [END]

    ep = endpoint(SCRIPT)
    options = types.HttpOptions(base_url="http://rollout", httpx_client=uds_client(ep))
    client = genai.Client(api_key=ep.token, http_options=options)
    started, times, parts = time.monotonic(), [], []
    for chunk in client.models.generate_content_stream(
        model="gemini-x",
        contents="Task i-1: fix it.",
        config=types.GenerateContentConfig(tools=[types.Tool(function_declarations=[{"name": "bash"}])]),
    ):
        for part in chunk.candidates[0].content.parts or []:
            parts.append(part)
            if part.text:
                times.append(time.monotonic())
    assert_live(started, times)
    assert "".join(p.text for p in parts if p.text) == TEXT
    assert [p.function_call.args for p in parts if p.function_call] == [{"cmd": "ls -la"}]
    assert chunk.candidates[0].finish_reason == types.FinishReason.STOP
    assert ep.counters.streamed_calls == 1 and ep.counters.stream_mismatches == 0
