"""A new attempt's harness answered from the lost attempt's logged calls (`agents.harness.replay`).

Two endpoints on the real tokenizer, each on its own LLM simulator (the named fake of vLLM's
token-id API), driven by the official SDK clients over real HTTP: the first is the attempt that
logged its calls, the second the new attempt that gets them as `resume_turns` (as RUN gets them
from `tasks.recovery.resume.turns_to_resume`). The second simulator's request count is what was
generated again.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.harness.conftest import BASH_TOOL, anthropic_client, openai_client, recorded

CALL_LS = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
CALL_CAT = 'Reading it.<tool_call>\n{"name": "bash", "arguments": {"cmd": "cat a.txt"}}\n</tool_call>'
SCRIPT = {"by_instance": {"i-1": [CALL_LS, CALL_CAT, "The bug is fixed."]}}
START = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Task i-1: fix it."}]
SAME = ("generated_ids", "logprobs", "text", "tool_calls", "finish_reason", "weight_version")


def chat(client: Any, observe: Any = lambda cmd, k: f"ran {cmd}", stream: bool = False) -> list[dict]:
    """A Chat Completions tool loop, as the example harness writes it; each reply as a dict
    (`observe(cmd, k)`: the tool's output of call k, what a sandbox would answer)."""
    messages, replies = list(START), []
    for k in range(3):
        message = _chat_reply(client, messages, stream)
        replies.append(message)
        messages.append(message)
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            cmd = json.loads(call["function"]["arguments"])["cmd"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": observe(cmd, k)})
    return replies


def _chat_reply(client: Any, messages: list[dict], stream: bool) -> dict:
    if not stream:
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL])
        return reply.choices[0].message.model_dump(exclude_none=True)
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL], stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(
                    tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = tc.id or slot["id"]
                slot["function"]["name"] += tc.function.name or ""
                slot["function"]["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish in ("stop", "tool_calls")  # the stream ended as a whole reply's does
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def generated(ep: Any) -> int:
    """Requests the endpoint's simulator answered (what was generated)."""
    url = ep.ctx.llm.spec.servers[0].url
    return httpx.get(f"{url}/sim/stats").json().get("requests", 0)


def logged(ep: Any, attempt: int = 1) -> list[dict]:
    """The endpoint's recorded turns as the database gives them to a new attempt."""
    return [{**turn, "attempt": attempt} for turn in recorded(ep)]


def arrays(ep: Any) -> tuple:
    result = ep.result("completed", "finish")
    return result.prompt_ids, result.response_ids, result.response_logprobs, result.loss_mask


@pytest.mark.parametrize("stream", [False, True])
def test_every_matching_call_is_answered_from_the_log_with_nothing_generated(endpoint, stream) -> None:
    first = endpoint(SCRIPT)
    before = chat(openai_client(first), stream=stream)
    again = endpoint(SCRIPT, attempt=2, resume_turns=logged(first))
    after = chat(openai_client(again), stream=stream)

    assert after == before  # the same replies, tool-call ids included
    assert generated(again) == 0 and generated(first) == 3
    assert arrays(again) == arrays(first)
    for old, new in zip(recorded(first), recorded(again)):
        assert {k: new[k] for k in SAME} == {k: old[k] for k in SAME}
        assert new["extra"]["replayed_from_attempt"] == 1
    metrics = again.result("completed", "finish").metrics
    assert (metrics["replayed_calls"], metrics["replay_divergences"]) == (3, [])
    assert metrics["turns"] == 3 and metrics["tool_calls"] == 2  # the record's counts are whole


def test_a_request_that_differs_is_generated_live_from_there_and_recorded(endpoint) -> None:
    first = endpoint(SCRIPT)
    chat(openai_client(first))
    again = endpoint(SCRIPT, attempt=2, resume_turns=logged(first))
    # the sandbox answers the first call otherwise: the second request is not the logged one
    chat(openai_client(again), observe=lambda cmd, k: f"ran {cmd}" if k else "a.txt b.txt")

    metrics = again.result("completed", "finish").metrics
    assert metrics["replayed_calls"] == 1 and generated(again) == 2  # calls 1 and 2: live
    [divergence] = metrics["replay_divergences"]
    assert (divergence["call"], divergence["logged_attempt"], divergence["reason"]) == (1, 1, "prompt_differs")
    assert "a.txt b.txt" in divergence["requested"] and "ran ls" in divergence["logged"]
    turns = recorded(again)
    assert "replayed_from_attempt" in turns[0]["extra"]
    assert turns[1]["extra"]["replay_divergence"] == divergence  # noted on the first live turn
    assert "replayed_from_attempt" not in turns[2]["extra"] and "replay_divergence" not in turns[2]["extra"]
    # one prefix-consistent sample: the replayed reply, then the live ones
    assert metrics["samples"] == 1 and metrics["merges"] == 2


def test_when_the_log_runs_out_the_rest_is_live(endpoint) -> None:
    first = endpoint(SCRIPT)
    chat(openai_client(first))
    again = endpoint(SCRIPT, attempt=2, resume_turns=logged(first)[:2])  # the third was in flight
    chat(openai_client(again))
    metrics = again.result("completed", "finish").metrics
    assert (metrics["replayed_calls"], metrics["replay_divergences"], generated(again)) == (2, [], 1)
    assert arrays(again) == arrays(first)


def test_the_workspace_path_is_masked_and_noted(endpoint) -> None:
    task = "Task i-1: fix it in {ws}."

    def run(ep: Any, ws: str) -> None:
        client = openai_client(ep)
        messages = [START[0], {"role": "user", "content": task.format(ws=ws)}]
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL])
        assert reply.choices[0].message.tool_calls

    first = endpoint(SCRIPT, workspace="/w/r-1")
    run(first, "/w/r-1")
    again = endpoint(SCRIPT, attempt=2, workspace="/w/r-2", resume_turns=logged(first))
    run(again, "/w/r-2")
    assert generated(again) == 0
    [turn] = recorded(again)
    assert turn["extra"]["replay_masked"] == ["workspace"] and turn["extra"]["workspace"] == "/w/r-2"
    assert again.result("completed", "finish").metrics["replay_masked_calls"] == 1
    # any other difference is one
    third = endpoint(SCRIPT, attempt=3, workspace="/w/r-3", resume_turns=logged(first))
    run(third, "/w/r-4")
    assert generated(third) == 1


def anthropic_converse(client: Any) -> list[dict]:
    """The Messages API tool loop, streamed (the SDK's own stream parser assembles each reply)."""
    tools = [
        {"name": "bash", "description": "Run a shell command", "input_schema": BASH_TOOL["function"]["parameters"]}
    ]
    messages: list[dict] = [{"role": "user", "content": "Task i-1: fix it."}]
    replies = []
    for _ in range(3):
        kwargs = {"model": "policy", "max_tokens": 200, "system": "You fix bugs.", "tools": tools}
        with client.messages.stream(messages=messages, **kwargs) as events:
            kinds = [event.type for event in events]
            reply = events.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        content = [b.model_dump(exclude_none=True) for b in reply.content]
        replies.append({"content": content, "stop_reason": reply.stop_reason})
        messages.append({"role": "assistant", "content": content})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            break
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "ok"} for b in uses]}
        )
    return replies


def test_a_replayed_anthropic_stream_is_a_valid_messages_stream(endpoint) -> None:
    first = endpoint(SCRIPT)
    before = anthropic_converse(anthropic_client(first))
    again = endpoint(SCRIPT, attempt=2, resume_turns=logged(first))
    after = anthropic_converse(anthropic_client(again))
    assert after == before and generated(again) == 0  # tool_use ids included
    assert [r["stop_reason"] for r in after] == ["tool_use", "tool_use", "end_turn"]


def test_a_first_attempt_compares_nothing(endpoint) -> None:
    ep = endpoint(SCRIPT)
    chat(openai_client(ep))
    assert ep.runner.replay is None
    assert "replayed_calls" not in ep.result("completed", "finish").metrics
    assert "replayed_from_attempt" not in recorded(ep)[0]["extra"]


def test_a_replayed_responses_stream_is_a_valid_event_stream(endpoint) -> None:
    from tests.harness.test_responses_endpoint import SCRIPT as RESPONSES_SCRIPT
    from tests.harness.test_responses_endpoint import tool_loop

    def said(replies: list) -> list:  # what a harness reads of each reply (the SDK parsed its events)
        return [
            [(o.type, getattr(o, "call_id", None), getattr(o, "arguments", None)) for o in r.output] for r in replies
        ]

    first = endpoint(RESPONSES_SCRIPT)
    before = tool_loop(openai_client(first), stream=True)
    again = endpoint(RESPONSES_SCRIPT, attempt=2, resume_turns=logged(first))
    after = tool_loop(openai_client(again), stream=True)
    assert said(after) == said(before) and generated(again) == 0
    assert after[-1].output_text == before[-1].output_text == "The bug is fixed."
