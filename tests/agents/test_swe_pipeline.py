"""`swe` and `code` end to end through the real pipeline: gateway, Celery workers, bwrap.

The LLM simulator (a fake vLLM, named as such) is scripted per instance to succeed, to fail,
to send a malformed call and to hang a command past the tool timeout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fakellm.server import start_simulator
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
SWE = {
    json.loads(line)["instance_id"]: json.loads(line)
    for line in (REPO / "examples/swe/instances.jsonl").read_text().splitlines()
}
CODE = {
    json.loads(line)["instance_id"]: json.loads(line)
    for line in (REPO / "examples/code.jsonl").read_text().splitlines()
}
INTERVALS, SLUGIFY, MONEY = (f"raas-examples__{n}-1" for n in ("intervals", "slugify", "money"))


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def as_instance(instance_id: str, source: dict) -> dict:
    return {"instance_id": instance_id, "data": {k: v for k, v in source[instance_id].items() if k != "instance_id"}}


def statement(source: dict, instance_id: str) -> str:
    return source[instance_id]["problem_statement"].strip().splitlines()[0]


SCRIPT = {
    "by_instance": {
        statement(SWE, INTERVALS): [
            call(
                "str_replace_editor",
                command="str_replace",
                path="intervals/core.py",
                old_str="merged[-1][1] = end\n",
                new_str="merged[-1][1] = max(merged[-1][1], end)\n",
            ),
            call("submit"),
        ],
        statement(SWE, SLUGIFY): [call("bash", command="ls"), call("submit")],
        statement(SWE, MONEY): [
            '<tool_call>{"name": "bash", "arguments": {"command": </tool_call>',
            call("bash", command="sleep 100"),
            call("bash", command="echo alive"),
            call("submit"),
        ],
        statement(CODE, "code-fizzbuzz"): [
            call(
                "str_replace_editor",
                command="create",
                path="solution.py",
                file_text=CODE["code-fizzbuzz"]["reference_solution"],
            ),
            call("bash", command="python3 -c 'from solution import fizzbuzz; print(fizzbuzz(3))'"),
            call("submit"),
        ],
        statement(CODE, "code-palindrome"): [
            call(
                "str_replace_editor",
                command="create",
                path="solution.py",
                file_text="def is_palindrome(text):\n    return text == text[::-1]\n",
            ),
            call("submit"),
        ],
    }
}


@pytest.fixture
def service(tmp_path, built_env):
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "pytest").symlink_to(built_env("pytest", ["pytest"]))
    svc = start_service(tmp_path, concurrency=1)
    yield svc
    svc.stop()


@pytest.fixture
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 8192}
    stop()


def test_swe_and_code_jobs_run_to_rewards(service, llm) -> None:
    swe = service.client.submit(
        "swe",
        [as_instance(i, SWE) for i in (INTERVALS, SLUGIFY, MONEY)],
        limits={"max_turns": 6, "tool_timeout": 2},
        llm=llm,
    )
    code = service.client.submit(
        "code", [as_instance(i, CODE) for i in ("code-fizzbuzz", "code-palindrome")], limits={"max_turns": 5}, llm=llm
    )
    service.wait_done(swe.job_id, timeout=180)
    service.wait_done(code.job_id, timeout=180)

    by_id = {r.instance_id: r for r in service.all_results(swe.job_id)}
    assert {i: (r.outcome, r.reward) for i, r in by_id.items()} == {
        INTERVALS: ("completed", 1.0),
        SLUGIFY: ("completed", 0.0),
        MONEY: ("completed", 0.0),
    }, service.log_tail()
    fixed = service.client.rollout(by_id[INTERVALS].rollout_id)
    assert "max(merged[-1][1], end)" in fixed.extra["git_patch"]
    money = service.client.rollout(by_id[MONEY].rollout_id)
    observations = [t.observation for t in money.turns]
    assert "malformed tool call" in observations[0]
    assert "timed out" in observations[1] and observations[2].strip() == "alive"
    assert money.metrics["malformed_tool_calls"] == 1

    # POST /v1/rollouts/{id}/reevaluate grades the stored artifact again in a fresh sandbox
    again = service.client.reevaluate(by_id[INTERVALS].rollout_id, wait=120)
    [entry] = again.extra["reevaluations"]
    assert entry["reward"] == 1.0 and entry["request_id"] == again.extra["reevaluation_request"]
    assert again.reward == 1.0  # the rollout's own reward is untouched
    unfixed = service.client.reevaluate(by_id[SLUGIFY].rollout_id, wait=120)
    assert unfixed.extra["reevaluations"][0]["reward"] == 0.0

    results = service.all_results(code.job_id)
    rewards = {r.instance_id: r.reward for r in results}
    assert rewards["code-fizzbuzz"] == 1.0
    # every agent re-evaluates: the same EVAL on the stored artifact (here the solution file)
    fizz = next(r for r in results if r.instance_id == "code-fizzbuzz")
    again = service.client.reevaluate(fizz.rollout_id, wait=120)
    assert again.extra["reevaluations"][0]["reward"] == 1.0
    assert 0.0 < rewards["code-palindrome"] < 1.0  # case/punctuation tests fail


@pytest.mark.parametrize(
    "agent, data, field",
    [
        ("swe", {"repo": "examples/swe/intervals/repo"}, "instance.base_commit"),
        ("code", {"problem_statement": "x"}, "instance.hidden_tests"),
    ],
)
def test_bad_instances_are_rejected_at_submission(service, llm, agent, data, field) -> None:
    import httpx

    response = httpx.post(
        f"{service.url}/v1/jobs", json={"agent": agent, "instances": [{"instance_id": "bad", "data": data}], "llm": llm}
    )
    assert response.status_code == 400, response.text
    assert field in response.text
