"""The shared agent loop on a real LLMSession against the LLM simulator (pure-Python tools).

Sandbox tools are exercised in test_loop_sandbox.py; here the tools are plain `Tool`s so each
test isolates one stopping rule or bookkeeping rule of the loop.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from agents.counters import RolloutCounters
from agents.loop import run_agent_loop
from agents.tools import Tool, ToolOutput, finish_tool
from core.errors import RolloutCancelled


def call(name: str, **arguments: Any) -> str:
    """A Hermes-format tool call as the model would write it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def echo_tool(log: list[str] | None = None) -> Tool:
    def run(ctx, arguments: dict[str, Any]) -> ToolOutput:
        if log is not None:
            log.append(arguments["text"])
        return ToolOutput(f"echo: {arguments['text']}")

    return Tool(
        "echo",
        "Echo text back.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["text"],
            "properties": {"text": {"type": "string"}},
        },
        run,
    )


def sleep_tool() -> Tool:
    return Tool(
        "sleep",
        "Sleep.",
        {"type": "object", "properties": {"seconds": {"type": "number"}}},
        lambda ctx, a: time.sleep(a["seconds"]) or "slept",
    )


TOOLS = [echo_tool(), finish_tool()]


def run(make_llm, make_ctx, replies: list[Any], tools: list[Tool] = TOOLS, max_model_len: int = 4096, **kw: Any):
    ctx_kw = {k: kw.pop(k) for k in ("limits", "timeout", "cancel_check") if k in kw}
    llm = make_llm({"default": replies}, max_model_len=max_model_len)
    ctx = make_ctx(llm=llm, **ctx_kw)
    result = run_agent_loop(ctx, system_prompt="You are a test agent.", user_prompt="Do the task.", tools=tools, **kw)
    return ctx, result


def test_finish_tool_ends_with_answer_and_token_exact_trajectory(make_llm, make_ctx) -> None:
    ctx, result = run(make_llm, make_ctx, ["Let me echo. " + call("echo", text="hi"), call("finish", answer="42")])
    assert (result.outcome, result.finish_reason) == ("completed", "finish")
    assert result.extra["answer"] == "42"
    turns = ctx.turns_recorded
    assert [t["index"] for t in turns] == [0, 1]
    assert turns[0]["tool_calls"] == [{"name": "echo", "arguments": {"text": "hi"}}]
    assert turns[0]["observation"] == "echo: hi" and turns[0]["observation_ids"]
    assert turns[1]["observation"] is None
    # The response is exactly: generated ids (mask 1) then observation ids (mask 0), per turn.
    expected_ids, expected_mask = [], []
    for turn in turns:
        expected_ids += turn["generated_ids"] + turn["observation_ids"]
        expected_mask += [1] * len(turn["generated_ids"]) + [0] * len(turn["observation_ids"])
    assert result.response_ids == expected_ids and result.loss_mask == expected_mask
    assert len(result.response_logprobs) == len(result.response_ids)
    assert result.metrics["retokenization_drift"] == 0
    assert result.metrics["turns"] == 2 and result.metrics["tool_calls"] == 2
    assert result.token_exact is True
    assert [m["role"] for m in result.messages] == ["system", "user", "assistant", "tool", "assistant"]


def test_tool_list_goes_into_system_prompt_when_template_cannot_render_tools(make_llm, make_ctx) -> None:
    _, result = run(make_llm, make_ctx, [call("finish", answer="x")])
    system = result.messages[0]["content"]
    assert "<tools>" in system and '"name": "echo"' in system and "<tool_call>" in system


def test_several_calls_per_turn_run_in_order(make_llm, make_ctx) -> None:
    seen: list[str] = []
    ctx, result = run(
        make_llm,
        make_ctx,
        [call("echo", text="a") + "\n" + call("echo", text="b"), call("finish", answer="ok")],
        tools=[echo_tool(seen), finish_tool()],
    )
    assert seen == ["a", "b"]
    assert ctx.turns_recorded[0]["observation"] == "echo: a\necho: b"
    assert result.metrics["tool_calls"] == 3


def test_calls_after_finish_in_the_same_turn_are_not_run(make_llm, make_ctx) -> None:
    seen: list[str] = []
    _, result = run(
        make_llm,
        make_ctx,
        [call("finish", answer="1") + call("echo", text="late")],
        tools=[echo_tool(seen), finish_tool()],
    )
    assert result.finish_reason == "finish" and seen == []


def test_malformed_call_becomes_observation_and_is_counted(make_llm, make_ctx) -> None:
    ctx, result = run(
        make_llm,
        make_ctx,
        ['<tool_call>{"name": "echo", "arguments": {"text": </tool_call>', call("finish", answer="done")],
    )
    assert result.finish_reason == "finish" and result.outcome == "completed"
    assert "malformed tool call" in ctx.turns_recorded[0]["observation"]
    assert ctx.turns_recorded[0]["extra"]["parse_errors"]
    shared = RolloutCounters().metrics()  # the names a harness rollout reports them by too
    assert {k: result.metrics[k] for k in shared} == {
        "turns": 2,
        "tool_calls": 1,
        "malformed_tool_calls": 1,
        "replies_without_tool_call": 1,
    }


def test_unknown_tool_and_bad_arguments_are_observations(make_llm, make_ctx) -> None:
    ctx, result = run(
        make_llm, make_ctx, [call("rm_rf", path="/"), call("echo", txt="typo"), call("finish", answer="ok")]
    )
    observations = [t["observation"] for t in ctx.turns_recorded[:2]]
    assert "unknown tool 'rm_rf'" in observations[0] and "echo" in observations[0]
    assert "missing required argument(s): text" in observations[1]
    assert result.metrics["invalid_tool_calls"] == 2 and result.outcome == "completed"


def test_no_valid_action_in_n_turns_is_agent_error(make_llm, make_ctx) -> None:
    ctx, result = run(make_llm, make_ctx, ["I am thinking.", call("nope"), "still thinking"], max_invalid_turns=3)
    assert (result.outcome, result.finish_reason) == ("agent_error", "no_valid_action")
    assert len(ctx.turns_recorded) == 3
    assert "No tool call found" in ctx.turns_recorded[0]["observation"]


def test_a_valid_action_resets_the_invalid_streak(make_llm, make_ctx) -> None:
    _, result = run(
        make_llm,
        make_ctx,
        ["hmm", "hmm", call("echo", text="x"), "hmm", "hmm", call("finish", answer="y")],
        max_invalid_turns=3,
    )
    assert result.finish_reason == "finish" and result.metrics["turns"] == 6


def test_max_turns(make_llm, make_ctx) -> None:
    ctx, result = run(make_llm, make_ctx, [call("echo", text="again")], limits={"max_turns": 4})
    assert (result.outcome, result.finish_reason) == ("completed", "max_turns")
    assert len(ctx.turns_recorded) == 4


def test_context_exhausted_stops_with_context(make_llm, make_ctx) -> None:
    long_reply = "word " * 120 + call("echo", text="x")
    ctx, result = run(make_llm, make_ctx, [long_reply], max_model_len=900)
    assert (result.outcome, result.finish_reason) == ("completed", "context")
    assert len(result.prompt_ids) + len(result.response_ids) <= 900


def test_generated_token_budget_stops_with_token_budget(make_llm, make_ctx) -> None:
    ctx, result = run(make_llm, make_ctx, [call("echo", text="x")], limits={"max_tokens": 100, "max_turns": 50})
    assert result.finish_reason == "token_budget" and len(ctx.turns_recorded) < 50
    assert sum(result.loss_mask) == 100


def test_deadline_ends_the_loop_keeping_the_trajectory(make_llm, make_ctx) -> None:
    """The agent's own tool calls used the time: the policy's failure (tests/agents/
    test_deadline_classes.py has the infrastructure's side)."""
    ctx, result = run(
        make_llm,
        make_ctx,
        [call("sleep", seconds=1.5)],
        tools=[sleep_tool(), finish_tool()],
        timeout=2.0,
        limits={"run_timeout": 2.0},
    )
    assert (result.outcome, result.finish_reason) == ("agent_error", "deadline")
    assert len(ctx.turns_recorded) >= 1 and result.response_ids


def test_cancel_propagates_after_persisting_the_turn(make_llm, make_ctx) -> None:
    cancelled = {"flag": False}
    seen: list[str] = []

    def echo_then_cancel(ctx, arguments):
        cancelled["flag"] = True
        seen.append(arguments["text"])
        return "ok"

    tool = Tool("echo", "Echo.", {"type": "object", "properties": {"text": {"type": "string"}}}, echo_then_cancel)
    llm = make_llm({"default": [call("echo", text="1")]})
    ctx = make_ctx(llm=llm, cancel_check=lambda: cancelled["flag"])
    with pytest.raises(RolloutCancelled):
        run_agent_loop(ctx, system_prompt="s", user_prompt="u", tools=[tool, finish_tool()])
    assert len(ctx.turns_recorded) == 1 and seen == ["1"]


def test_each_turn_is_recorded_before_the_next_generation(make_llm, make_ctx) -> None:
    llm = make_llm({"default": [call("echo", text="a"), call("echo", text="b"), call("finish", answer="c")]})
    url = llm.spec.servers[0].url
    generations_at_record: list[int] = []

    ctx = make_ctx(
        llm=llm,
        record_turn=lambda **turn: generations_at_record.append(httpx.get(f"{url}/sim/stats").json()["requests"]),
    )
    run_agent_loop(ctx, system_prompt="s", user_prompt="u", tools=TOOLS)
    assert generations_at_record == [1, 2, 3]


def test_each_turn_is_durable_before_the_next_turns_tool_calls_run(make_llm, make_ctx) -> None:
    """The commit of turn k overlaps generation k+1, but turn k+1's tools never run before
    turn k is durable (`settle_turns`): at most the turn in flight has unlogged effects."""
    import dataclasses

    llm = make_llm({"default": [call("echo", text="a"), call("echo", text="b"), call("finish", answer="c")]})
    events: list[str] = []
    pending: list[int] = []

    def settle() -> None:
        events.extend(f"durable {i}" for i in pending)
        pending.clear()

    ctx = make_ctx(llm=llm, record_turn=lambda **turn: pending.append(turn["index"]))
    ctx = dataclasses.replace(ctx, settle_turns=settle)
    run_agent_loop(ctx, system_prompt="s", user_prompt="u", tools=[echo_tool(events), finish_tool()])
    assert events == ["a", "durable 0", "b", "durable 1", "durable 2"]


def test_final_answer_hook_accepts_a_reply_without_tool_call(make_llm, make_ctx) -> None:
    def boxed(text: str) -> str | None:
        return text.split("\\boxed{")[1].split("}")[0] if "\\boxed{" in text else None

    _, result = run(make_llm, make_ctx, ["thinking...", "The answer is \\boxed{7}."], final_answer=boxed)
    assert (result.finish_reason, result.extra["answer"]) == ("finish", "7")
    assert result.metrics["turns"] == 2
