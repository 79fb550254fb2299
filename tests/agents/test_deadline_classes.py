"""Whose time ran out (`agents.time_split`): the loop on a real LLMSession against the LLM
simulator (a fake vLLM, named as such), and the harness handler's decision from its
endpoint's counters (`agents/handlers/harness/ending.py`).

The pipeline twins (real workers, sandboxes, paused pool): tests/agents/test_deadline_pipeline.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agents.harness.endpoint import EndpointCounters
from agents.handlers.harness.ending import classify
from agents.handlers.harness.launch import Ending
from agents.loop import run_agent_loop
from agents.time_split import AGENT_SHARE, TimeSplit, expected_generation_seconds
from agents.tools import Tool, finish_tool


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def sleep_tool() -> Tool:
    return Tool(
        "sleep",
        "Sleep.",
        {"type": "object", "properties": {"seconds": {"type": "number"}}},
        lambda ctx, a: time.sleep(a["seconds"]) or "slept",
    )


def run(make_llm, make_ctx, script: dict, run_timeout: float, max_tokens: int = 16):
    llm = make_llm(script, sampling={"max_tokens": max_tokens})
    ctx = make_ctx(llm=llm, timeout=run_timeout, limits={"run_timeout": run_timeout, "max_turns": 20})
    return run_agent_loop(
        ctx, system_prompt="You are a test agent.", user_prompt="Do it.", tools=[sleep_tool(), finish_tool()]
    )


# -- the rule -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "split, outcome",
    [
        (TimeSplit(elapsed=8, generation=0.2, agent_own=7.6, waiting=0.0, paused=0), "agent_error"),
        (TimeSplit(elapsed=8, generation=1.0, agent_own=1.0, waiting=5.8, paused=0), "timeout"),
        # a 100 s pause moved the deadline on: it is not in the charged time
        (TimeSplit(elapsed=108, generation=0.5, agent_own=7.0, waiting=0.2, paused=100), "agent_error"),
        # raas's own work (not measured as the agent's) never becomes the policy's
        (TimeSplit(elapsed=8, generation=0.5, agent_own=3.0, waiting=0.0, paused=0), "timeout"),
    ],
)
def test_the_agents_majority_of_the_charged_time_makes_a_deadline_the_policys(split, outcome) -> None:
    assert split.deadline_outcome() == outcome
    assert (split.agent_share >= AGENT_SHARE) == (outcome == "agent_error")
    metrics = split.to_metrics()
    assert set(metrics) == {"elapsed", "generation", "tools", "waiting", "paused", "other", "agent_share"}


# -- the loop on a real session -------------------------------------------------------------
def test_the_stall_attack_is_the_policys_deadline(make_llm, make_ctx) -> None:
    """A tool call that sleeps every turn until the deadline: tools time, agent_error."""
    result = run(make_llm, make_ctx, {"default": [call("sleep", seconds=1.2)]}, run_timeout=3.0, max_tokens=64)
    assert (result.outcome, result.finish_reason) == ("agent_error", "deadline")
    split = result.metrics["time_split"]
    assert split["tools"] >= 2.0 and split["waiting"] < 0.5, split
    assert split["agent_share"] >= AGENT_SHARE


def test_a_stalled_inference_server_is_the_infrastructures_deadline(make_llm, make_ctx) -> None:
    """The server answers nothing for longer than any 16-token reply could take: waiting."""
    result = run(make_llm, make_ctx, {"default": [{"text": call("sleep", seconds=0.1), "latency": 30}]}, 6.0)
    assert (result.outcome, result.finish_reason) == ("timeout", "deadline")
    split = result.metrics["time_split"]
    assert split["generation"] <= expected_generation_seconds(16) + 0.05, split
    assert split["waiting"] >= 2.5 and split["agent_share"] < AGENT_SHARE, split


def test_a_reply_rambling_to_the_deadline_is_the_policys_time(make_llm, make_ctx) -> None:
    """The same slow answer, but the policy asked for up to 1024 tokens (51 s at the expected
    rate): the deadline cut its own generation, not a stalled server."""
    script = {"default": [{"text": call("sleep", seconds=0.1), "latency": 30}]}
    result = run(make_llm, make_ctx, script, 4.0, max_tokens=1024)
    assert (result.outcome, result.finish_reason) == ("agent_error", "deadline")
    assert result.metrics["time_split"]["generation"] >= 3.0, result.metrics["time_split"]


# -- the harness handler's decision ---------------------------------------------------------
POLICY_TIME = TimeSplit(elapsed=10, generation=1, agent_own=8.5, waiting=0, paused=0, own_label="harness")
INFRA_TIME = TimeSplit(elapsed=10, generation=1, agent_own=1, waiting=7.5, paused=0, own_label="harness")


def ended(code: int | None) -> Ending:
    if code is None:
        return Ending("timeout", "deadline", None, "")
    return Ending("completed", "finish", 0, "") if code == 0 else Ending("agent_error", "harness_exit", code, "")


@pytest.mark.parametrize(
    "code, counters, split, expected",
    [
        # smolagents' default tool_choice "required": refused (400), the harness exits 1
        (
            1,
            EndpointCounters(calls=1, failed_calls=1, errors={"invalid_request": 1}),
            POLICY_TIME,
            ("infra_error", "endpoint_refused"),
        ),
        # a refusal after calls that worked is still the endpoint's (not the policy's)
        (
            1,
            EndpointCounters(calls=3, failed_calls=1, errors={"invalid_request": 1}),
            POLICY_TIME,
            ("infra_error", "endpoint_refused"),
        ),
        (
            1,
            EndpointCounters(calls=1, failed_calls=1, errors={"not_found": 1}),
            POLICY_TIME,
            ("infra_error", "endpoint_refused"),
        ),
        (
            1,
            EndpointCounters(calls=0, failed_calls=0, unauthorized=1, errors={"authentication": 1}),
            POLICY_TIME,
            ("infra_error", "endpoint_refused"),
        ),
        # it never got a model call answered: it cannot start
        (127, EndpointCounters(), POLICY_TIME, ("infra_error", "harness_start")),
        # its own crash after the model acted (the model's command killed it)
        (-9, EndpointCounters(calls=1), POLICY_TIME, ("agent_error", "harness_exit")),
        # its context or budget spent: the policy's own use, not a refusal
        (
            1,
            EndpointCounters(calls=4, failed_calls=1, errors={"context_length_exceeded": 1}),
            POLICY_TIME,
            ("agent_error", "harness_exit"),
        ),
        # its timeout: by the time split
        (None, EndpointCounters(calls=2), POLICY_TIME, ("agent_error", "deadline")),
        (None, EndpointCounters(calls=2), INFRA_TIME, ("timeout", "deadline")),
        # ... unless the policy never acted (hung before its first answered call)
        (None, EndpointCounters(), POLICY_TIME, ("infra_error", "harness_start")),
        # ... or the endpoint refused it (a harness retrying a refused request until its timeout)
        (
            None,
            EndpointCounters(calls=9, failed_calls=8, errors={"invalid_request": 8}),
            POLICY_TIME,
            ("infra_error", "endpoint_refused"),
        ),
        # it gave up on the endpoint's deadline_exceeded: a deadline, by the split too
        (
            1,
            EndpointCounters(calls=3, failed_calls=1, errors={"deadline_exceeded": 1}),
            POLICY_TIME,
            ("agent_error", "deadline"),
        ),
        (
            1,
            EndpointCounters(calls=3, failed_calls=1, errors={"deadline_exceeded": 1}),
            INFRA_TIME,
            ("timeout", "deadline"),
        ),
        (
            0,
            EndpointCounters(calls=1, failed_calls=1, errors={"invalid_request": 1}),
            POLICY_TIME,
            ("completed", "finish"),
        ),  # it coped with the refusal: graded as usual
    ],
)
def test_the_harness_ending_is_decided_from_the_endpoints_counters(code, counters, split, expected) -> None:
    assert classify(ended(code), counters, split) == expected
