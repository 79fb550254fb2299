"""A RUN continued from its logged turns gives the arrays of an uninterrupted run.

The loop runs a scripted episode on the LLM simulator; a second loop (a new session, as a new
worker would open) gets the first turns as `ctx.resume_turns` and must produce the same token
arrays, messages and counters while asking the simulator only for the turns not logged.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from agents.loop import run_agent_loop
from agents.tools import finish_tool
from core.errors import ResumeError
from tests.agents.test_loop import call, echo_tool

REPLIES = [
    "First I echo. " + call("echo", text="a"),
    "no tool call here",
    call("nope", text="b"),
    call("echo", text="c"),
    call("finish", answer="42"),
]
ARRAYS = (
    "prompt_ids",
    "response_ids",
    "response_logprobs",
    "loss_mask",
    "policy_versions",
    "messages",
    "token_exact",
    "outcome",
    "finish_reason",
)


def _episode(make_llm, make_ctx, resume_turns: list[dict[str, Any]] | None = None):
    llm = make_llm({"default": REPLIES})
    ctx = make_ctx(llm=llm, state={"kept": 1}, resume_turns=resume_turns)
    tool = echo_tool()
    seen = []

    def counting(ctx_, arguments):  # the tool keeps what it saw in ctx.state, like search
        ctx_.state.setdefault("seen", []).append(arguments["text"])
        seen.append(arguments["text"])
        return original(ctx_, arguments)

    original, tool.run = tool.run, counting
    result = run_agent_loop(
        ctx,
        system_prompt="You are a test agent.",
        user_prompt="Do it.",
        tools=[tool, finish_tool()],
        max_invalid_turns=5,
    )
    url = llm.pool.candidate_urls()[0]
    return ctx, result, seen, url


def _generations(url: str) -> int:
    return httpx.get(f"{url}/sim/stats").json().get("requests", 0)


@pytest.mark.parametrize("logged", [1, 2, 4, 5])
def test_resumed_loop_equals_uninterrupted(make_llm, make_ctx, logged: int) -> None:
    full_ctx, full, full_seen, _ = _episode(make_llm, make_ctx)
    assert full.finish_reason == "finish" and len(full_ctx.turns_recorded) == 5
    ctx, resumed, seen, url = _episode(make_llm, make_ctx, full_ctx.turns_recorded[:logged])
    for name in ARRAYS:
        assert getattr(resumed, name) == getattr(full, name), name
    assert _generations(url) == 5 - logged  # logged turns are never generated again
    assert seen == [t for t in full_seen][len(full_seen) - len(seen) :]  # nor executed again
    assert [t["index"] for t in ctx.turns_recorded] == list(range(logged, 5))
    assert ctx.state == full_ctx.state
    expected = {k: v for k, v in full.metrics.items() if not _timing(k)}
    got = {k: v for k, v in resumed.metrics.items() if not _timing(k)}
    assert got.pop("resumed_from_turn") == logged and got.pop("resumes") == 1
    assert got == expected and resumed.extra["answer"] == "42"


def test_a_gap_or_another_prompt_refuses_to_resume(make_llm, make_ctx) -> None:
    full_ctx, _, _, _ = _episode(make_llm, make_ctx)
    turns = full_ctx.turns_recorded
    with pytest.raises(ResumeError, match="indexes"):
        _episode(make_llm, make_ctx, [turns[0], turns[2]])
    changed = [dict(turns[0], loop_state={**turns[0]["loop_state"], "prompt_digest": "x"})]
    with pytest.raises(ResumeError, match="prompt"):
        _episode(make_llm, make_ctx, changed)


def test_turns_logged_under_the_old_counter_name_resume_with_their_count(make_llm, make_ctx) -> None:
    """A `loop_state` logged before `agents.counters` names its malformed calls `parse_errors`
    (and has no `replies_without_tool_call`): a resume from it keeps the count."""
    full_ctx, full, _, _ = _episode(make_llm, make_ctx)
    old = []
    for turn in full_ctx.turns_recorded[:2]:
        state = {
            k: v
            for k, v in turn["loop_state"].items()
            if k not in ("malformed_tool_calls", "replies_without_tool_call")
        }
        old.append(dict(turn, loop_state={**state, "parse_errors": 7}))
    _, resumed, _, _ = _episode(make_llm, make_ctx, old)
    assert resumed.metrics["malformed_tool_calls"] == 7 + full.metrics["malformed_tool_calls"]
    assert "parse_errors" not in resumed.metrics and resumed.outcome == full.outcome


def _timing(key: str) -> bool:
    """A metric of seconds (each run's own): left out of the comparison."""
    return key.endswith("_seconds") or key == "time_split"
