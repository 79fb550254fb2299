"""Trajectories at the edges (issue 12, cases 1-4): context limits, budgets, finish reasons.

A real LLMSession over HTTP against the LLM simulator (a fake of vLLM's token-id API, named as
one) whose `max_model_len` rejects, like vLLM, any request whose prompt + max_tokens exceeds it.
So a test that passes also shows that no request ever asked for more than fits.
"""

from __future__ import annotations

import httpx
import pytest

from agents.loop import TURN_CUT_MESSAGE, run_agent_loop
from tests.agents.test_loop import TOOLS, call

LONG = "word " * 60  # ~60 tokens


def run(make_llm, make_ctx, replies, *, limits=None, sampling=None, max_model_len=4096, **server):
    llm = make_llm(
        {"default": replies}, max_model_len=max_model_len, sampling=sampling or {"max_tokens": 512}, **server
    )
    ctx = make_ctx(llm=llm, limits=limits)
    result = run_agent_loop(ctx, system_prompt="You are a test agent.", user_prompt="Do the task.", tools=TOOLS)
    return ctx, llm, result


def requests_served(llm) -> int:
    [url] = llm.pool.servers  # the job's one simulator
    return httpx.get(f"{url}/sim/stats").json().get("requests", 0)


def test_server_context_below_the_jobs_is_used_and_never_exceeded(make_llm, make_ctx) -> None:
    """Case 1: job says 8192, the server serves 700: every request fits 700, no infra error."""
    ctx, llm, result = run(
        make_llm,
        make_ctx,
        [LONG + call("echo", text="x")],
        max_model_len=8192,
        limits={"max_turns": 50},
        server_max=700,
    )
    assert llm.context_length == 700
    assert (result.outcome, result.finish_reason) == ("completed", "context")
    assert result.metrics["truncated"] is True and result.metrics["context_length"] == 700
    assert len(result.prompt_ids) + len(result.response_ids) <= 700
    assert len(ctx.turns_recorded) >= 2 and sum(result.loss_mask) > 100  # real turns happened


def test_server_that_does_not_report_its_context_ends_with_context(make_llm, make_ctx) -> None:
    """Case 1: the limit is only learnt from vLLM's 400: the rollout ends `context`, kept."""
    ctx, llm, result = run(
        make_llm,
        make_ctx,
        [LONG + call("echo", text="x")],
        max_model_len=8192,
        limits={"max_turns": 50},
        server_max=700,
        report=False,
    )
    assert (result.outcome, result.finish_reason) == ("completed", "context")
    assert len(ctx.turns_recorded) >= 2 and result.response_ids


def test_prompt_that_does_not_fit_is_not_a_sample(make_llm, make_ctx) -> None:
    """Case 2: never `completed` with reward 0: its own outcome, no turns, no request sent."""
    ctx, llm, result = run(make_llm, make_ctx, [call("finish", answer="1")], max_model_len=8192, server_max=60)
    assert (result.outcome, result.finish_reason) == ("prompt_too_long", "context")
    assert ctx.turns_recorded == [] and result.response_ids == []
    assert requests_served(llm) == 0


def test_prompt_rejected_by_the_server_is_not_a_sample(make_llm, make_ctx) -> None:
    ctx, llm, result = run(
        make_llm, make_ctx, [call("finish", answer="1")], max_model_len=8192, server_max=60, report=False
    )
    assert (result.outcome, result.finish_reason) == ("prompt_too_long", "context")


def test_max_tokens_is_a_hard_cap_on_generated_tokens(make_llm, make_ctx) -> None:
    """Case 3: limits.max_tokens=100 with sampling.max_tokens=512 generates exactly 100."""
    ctx, llm, result = run(
        make_llm, make_ctx, [LONG + call("echo", text="x")], limits={"max_tokens": 100, "max_turns": 50}
    )
    assert sum(result.loss_mask) == 100  # was 202: observations counted, request not capped
    assert (result.outcome, result.finish_reason) == ("completed", "token_budget")
    turns = ctx.turns_recorded
    assert turns[-1]["finish_reason"] == "token_budget"
    assert sum(len(t["generated_ids"]) for t in turns) == 100
    assert all(t["finish_reason"] == "stop" for t in turns[:-1])


def test_turn_length_cut_continues_by_default(make_llm, make_ctx) -> None:
    """Case 4: a cut at sampling.max_tokens is `turn_length`, and the episode goes on."""
    ctx, llm, result = run(
        make_llm, make_ctx, [LONG + call("echo", text="x"), call("finish", answer="42")], sampling={"max_tokens": 40}
    )
    first, second = ctx.turns_recorded
    assert first["finish_reason"] == "turn_length" and len(first["generated_ids"]) == 40
    assert first["observation"] == TURN_CUT_MESSAGE.format(n=40)
    assert first["tool_calls"] == []  # nothing in a cut turn runs
    assert second["finish_reason"] == "stop"
    assert (result.outcome, result.finish_reason, result.extra["answer"]) == ("completed", "finish", "42")
    assert result.metrics["truncated"] is False


def test_turn_length_cut_can_end_the_episode(make_llm, make_ctx) -> None:
    ctx, llm, result = run(
        make_llm,
        make_ctx,
        [LONG + call("echo", text="x"), call("finish", answer="42")],
        sampling={"max_tokens": 40},
        limits={"continue_after_turn_length": False},
    )
    assert (result.outcome, result.finish_reason) == ("completed", "turn_length")
    assert len(ctx.turns_recorded) == 1 and result.metrics["truncated"] is True


def test_repeated_turn_length_cuts_are_no_valid_action(make_llm, make_ctx) -> None:
    ctx, llm, result = run(make_llm, make_ctx, [LONG], sampling={"max_tokens": 10})
    assert (result.outcome, result.finish_reason) == ("agent_error", "no_valid_action")
    assert [t["finish_reason"] for t in ctx.turns_recorded] == ["turn_length"] * 3


@pytest.mark.parametrize("on_stale", ["mark", "stop"])
def test_max_staleness_marks_or_stops(make_llm, make_ctx, on_stale) -> None:
    """Case 8: a weight update between turns (the trainer's PUT) makes the rollout stale.

    The pool is the session's in-process one; the update rewrites the version it reports,
    as the registered pool would after `PUT /v1/llm-servers/<id>`.
    """
    from dataclasses import replace

    from agents.tools import Tool

    llm = make_llm({"default": [call("update", text="x"), call("echo", text="y"), call("finish", answer="1")]})
    [url] = llm.pool.servers
    llm.pool.servers[url] = replace(llm.pool.servers[url], weight_version="v1")

    def weight_update(ctx, arguments):
        llm.pool.servers[url] = replace(llm.pool.servers[url], weight_version="v2")
        return "updated"

    tools = [Tool("update", "Stands in for a trainer's weight update.", {"type": "object"}, weight_update), *TOOLS]
    ctx = make_ctx(llm=llm, limits={"max_staleness": 0, "on_stale": on_stale})
    result = run_agent_loop(ctx, system_prompt="s", user_prompt="u", tools=tools)
    versions = [t["weight_version"] for t in ctx.turns_recorded]
    assert result.metrics["stale"] is True and result.metrics["staleness"] == 1
    if on_stale == "stop":
        assert versions == ["v1", "v2"] and result.finish_reason == "stale"
    else:
        assert versions == ["v1", "v2", "v2"] and result.finish_reason == "finish"
