"""A new attempt replays an earlier attempt's logged turns into its rebuilt sandbox.

The loop runs a scripted episode on the LLM simulator (attempt 1); a second loop, as attempt 2
(a new session and new tool state, as after a lost sandbox), gets attempt 1's first turns as
`ctx.resume_turns`: their tool calls run again, nothing logged is generated again, the turns are
logged again under attempt 2, and the arrays equal those of the uninterrupted episode. A tool
whose output changes (a clock) diverges: recorded, and the job's `resume.on_divergence` decides.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import httpx
import pytest

from agents.job_config import JobConfig
from agents.loop import run_agent_loop
from agents.tools import Tool, ToolOutput, finish_tool
from core.errors import ReplayDiverged
from tests.agents.test_loop import call
from tests.agents.test_loop_resume import ARRAYS

REPLIES = [
    call("clock"),
    "no tool call here",
    call("echo", text="c"),
    call("finish", answer="42"),
]


def _tools(executed: list[str], clock: itertools.count) -> list[Tool]:
    def echo(ctx, arguments):
        executed.append(f"echo {arguments['text']}")
        return ToolOutput(f"echo: {arguments['text']}")

    def tick(ctx, arguments):  # a tool that prints the time: another value in another sandbox
        executed.append("clock")
        return ToolOutput(f"time: {next(clock)}")

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return [Tool("echo", "Echo.", schema, echo), Tool("clock", "Time.", {"type": "object"}, tick), finish_tool()]


def _episode(make_llm, make_ctx, *, turns=None, attempt=1, clock_start=0, on_divergence="restart"):
    llm = make_llm({"default": REPLIES})
    config = JobConfig(resume={"on_divergence": on_divergence})
    ctx = dataclasses.replace(make_ctx(llm=llm, resume_turns=turns, job_config=config), attempt=attempt)
    executed: list[str] = []
    result = run_agent_loop(
        ctx,
        system_prompt="You are a test agent.",
        user_prompt="Do it.",
        tools=_tools(executed, itertools.count(clock_start)),
        max_invalid_turns=5,
    )
    generated = httpx.get(f"{llm.pool.candidate_urls()[0]}/sim/stats").json().get("requests", 0)
    return ctx, result, executed, generated


def _logged_by_attempt_1(full_ctx, k: int) -> list[dict[str, Any]]:
    return [{**turn, "attempt": 1} for turn in full_ctx.turns_recorded[:k]]


@pytest.mark.parametrize("logged", [1, 3])
def test_replayed_attempt_equals_uninterrupted_and_generates_nothing_logged(make_llm, make_ctx, logged) -> None:
    full_ctx, full, _, _ = _episode(make_llm, make_ctx)
    ctx, replayed, executed, generated = _episode(
        make_llm,
        make_ctx,
        turns=_logged_by_attempt_1(full_ctx, logged),
        attempt=2,
        clock_start=100,
        on_divergence="continue",
    )
    for name in ARRAYS:
        assert getattr(replayed, name) == getattr(full, name), name
    assert generated == 4 - logged  # logged turns are never generated again
    assert executed[0] == "clock"  # ...but their tool calls ran again in the new sandbox
    assert [t["index"] for t in ctx.turns_recorded] == [0, 1, 2, 3]  # logged again here
    assert [t["extra"].get("replayed_from_attempt") for t in ctx.turns_recorded[:logged]] == [1] * logged
    assert replayed.metrics["replayed_turns"] == logged and replayed.extra["answer"] == "42"
    # the clock (turn 0) printed another time: recorded, and the policy kept the logged one
    [divergence] = replayed.metrics["replay_divergences"]
    assert divergence == {"turn": 0, "call": 0, "tool": "clock", "logged": "time: 0", "replayed": "time: 100"}
    assert ctx.turns_recorded[0]["extra"]["replay_divergences"] == [divergence]
    assert ctx.turns_recorded[0]["observation"] == full_ctx.turns_recorded[0]["observation"]


def test_a_divergence_restarts_when_the_job_says_so(make_llm, make_ctx) -> None:
    full_ctx, _, _, _ = _episode(make_llm, make_ctx)
    with pytest.raises(ReplayDiverged, match="replayed turn 0 diverged") as raised:
        _episode(make_llm, make_ctx, turns=_logged_by_attempt_1(full_ctx, 3), attempt=2, clock_start=100)
    assert raised.value.details["divergences"][0]["replayed"] == "time: 100"


def test_a_replay_that_matches_records_no_divergence(make_llm, make_ctx) -> None:
    full_ctx, full, _, _ = _episode(make_llm, make_ctx)
    ctx, replayed, executed, generated = _episode(
        make_llm, make_ctx, turns=_logged_by_attempt_1(full_ctx, 3), attempt=2, clock_start=0
    )  # the clock starts where it did: same output, so the default (restart) goes on
    assert replayed.metrics["replay_divergences"] == [] and replayed.metrics["replayed_turns"] == 3
    assert executed == ["clock", "echo c"] and generated == 1
    assert replayed.response_ids == full.response_ids


def test_a_replay_cut_short_goes_on_from_what_this_attempt_logged(make_llm, make_ctx) -> None:
    """Attempt 2's worker died after replaying turn 0 (logged again under attempt 2) with its
    sandbox alive: the resumed RUN gets attempt 2's turn, then attempt 1's from index 1, and
    replays only those."""
    full_ctx, full, _, _ = _episode(make_llm, make_ctx)
    first, _, _, _ = _episode(make_llm, make_ctx, turns=_logged_by_attempt_1(full_ctx, 1), attempt=2, clock_start=0)
    own = [{**first.turns_recorded[0], "attempt": 2}]
    merged = own + _logged_by_attempt_1(full_ctx, 3)[1:]
    ctx, replayed, executed, generated = _episode(make_llm, make_ctx, turns=merged, attempt=2)
    assert executed == ["echo c"] and generated == 1  # turn 0 was not run again, nor anything generated
    assert [t["index"] for t in ctx.turns_recorded] == [1, 2, 3]
    assert replayed.metrics["replayed_turns"] == 3  # 1 before the loss + 2 after
    assert replayed.response_ids == full.response_ids


class FakeCheckpoints:
    """A fake `WorkspaceCheckpoints` (this file's tools have no workspace): restores the turn
    it is told to and records the calls; the real store is tests/test_checkpoint_store.py."""

    def __init__(self, restores: int) -> None:
        self.restores, self.saved, self.asked = restores, [], []

    def save(self, turn: int, counts: dict[str, Any]) -> None:
        self.saved.append(turn)
        counts["saved"] = counts.get("saved", 0) + 1

    def restore(self, attempt: int, last_logged: int, counts: dict[str, Any]) -> int:
        self.asked.append((attempt, last_logged))
        return self.restores


def _with_checkpoints(make_llm, make_ctx, turns, checkpoints, on_divergence="restart"):
    llm = make_llm({"default": REPLIES})
    config = JobConfig(resume={"on_divergence": on_divergence, "checkpoints": True})
    ctx = dataclasses.replace(
        make_ctx(llm=llm, resume_turns=turns, job_config=config), attempt=2, checkpoints=checkpoints
    )
    executed: list[str] = []
    tools = _tools(executed, itertools.count(100))  # the clock would diverge if it ran again
    result = run_agent_loop(
        ctx, system_prompt="You are a test agent.", user_prompt="Do it.", tools=tools, max_invalid_turns=5
    )
    return ctx, result, executed


def test_turns_a_checkpoint_holds_are_restored_not_run_and_only_later_ones_replayed(make_llm, make_ctx) -> None:
    full_ctx, full, _, _ = _episode(make_llm, make_ctx)
    store = FakeCheckpoints(restores=1)
    ctx, result, executed = _with_checkpoints(make_llm, make_ctx, _logged_by_attempt_1(full_ctx, 3), store)
    assert store.asked == [(1, 2)]  # attempt 1's checkpoint, no later than its last logged turn
    assert executed == ["echo c"]  # turns 0-1 (the clock) did not run again; turn 2 was replayed
    assert result.metrics["restored_turns"] == 2 and result.metrics["replayed_turns"] == 1
    assert result.metrics["replay_divergences"] == [] and result.response_ids == full.response_ids
    marks = [
        (t["extra"].get("restored_from_checkpoint"), t["extra"].get("replayed_from_attempt"))
        for t in ctx.turns_recorded
    ]
    assert marks == [(1, 1), (1, 1), (None, 1), (None, None)]
    assert store.saved == [2, 3]  # its own checkpoint after the carried turns, then each live turn


def test_without_a_usable_checkpoint_every_turn_is_replayed(make_llm, make_ctx) -> None:
    full_ctx, _, _, _ = _episode(make_llm, make_ctx)
    store = FakeCheckpoints(restores=-1)
    _, result, executed = _with_checkpoints(
        make_llm, make_ctx, _logged_by_attempt_1(full_ctx, 3), store, on_divergence="continue"
    )
    assert executed[0] == "clock" and result.metrics["replayed_turns"] == 3
    assert result.metrics["restored_turns"] == 0


def test_a_run_resumed_in_place_after_a_restore_restores_nothing_again(make_llm, make_ctx) -> None:
    """Attempt 2 restored turns 0-1 and logged turn 0 again before its worker died (its sandbox
    alive): the resumed RUN knows the workspace holds turn 1 already and runs only turn 2."""
    full_ctx, full, _, _ = _episode(make_llm, make_ctx)
    logged = _logged_by_attempt_1(full_ctx, 3)
    own = [{**logged[0], "attempt": 2, "extra": {**logged[0]["extra"], "restored_from_checkpoint": 1}}]
    store = FakeCheckpoints(restores=1)
    ctx, result, executed = _with_checkpoints(make_llm, make_ctx, own + logged[1:], store)
    assert store.asked == [] and executed == ["echo c"]
    assert [t["index"] for t in ctx.turns_recorded] == [1, 2, 3]
    assert result.response_ids == full.response_ids
