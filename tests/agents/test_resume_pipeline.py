"""Resume instead of restart, end to end: real gateway, Celery worker processes, bwrap, reaper.

A scripted `math` rollout (the LLM simulator) keeps a value in the sandbox's persistent Python
session over its turns. Its RUN worker is SIGKILLed while turn 2 is being generated; the
reaper sees the lease stop beating, finds the sandbox alive on its node and queues RUN again in
the same attempt. The new worker rebuilds the session from the logged turns and goes on at
turn 2 in the same sandbox: the token arrays equal those of an uninterrupted rollout of the
same script, no turn index repeats, and only the turn in flight was generated again. A RUN
that raises a retryable error resumes the same way, without waiting for the reaper, and an
EVAL that does is graded again without running the rollout again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from fakellm.server import start_simulator
from core.db import session_scope
from core.models import Rollout, Turn
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
PROBLEM = "Compute 20 + 1, then double it."
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
    "reward",
)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# Turn 2 takes 4 s to "generate": the worker is killed in the middle of it.
SCRIPT = {
    "by_instance": {
        PROBLEM: [
            call("python", code="x = 20"),
            call("python", code="x += 1"),
            {"text": call("python", code="print(x * 2)"), "latency": 4},
            call("finish", answer="42"),
        ]
    }
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, built_env):
    home = tmp_path_factory.mktemp("resume-pipeline")
    (home / "envs").mkdir()
    (home / "envs" / "math").symlink_to(built_env("math", ["sympy", "numpy"]))
    svc = start_service(home, concurrency=2, handler_modules="tests.agents.resume_handlers")
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
    stop()


def _started(llm: dict) -> int:
    return httpx.get(f"{llm['servers'][0]['url']}/sim/stats").json().get("started", 0)


def _submit(service, llm, agent: str = "math") -> tuple[str, str]:
    accepted = service.client.submit(
        agent, [{"instance_id": "p", "data": {"problem": PROBLEM, "answer": "42"}}], limits={"max_turns": 6}, llm=llm
    )
    return accepted.job_id, accepted.rollout_ids[0]


def _turns(service, rollout_id: str) -> list[tuple[int, int]]:
    with session_scope(service.settings.db_url) as s:
        return [
            tuple(r)
            for r in s.execute(
                sa.select(Turn.attempt, Turn.index).where(Turn.rollout_id == rollout_id).order_by(Turn.id)
            )
        ]


def test_killed_run_worker_resumes_in_the_same_sandbox(service, llm) -> None:
    before = _started(llm)
    job, plain_id = _submit(service, llm)
    service.wait_done(job, timeout=120)
    plain = service.client.rollout(plain_id)
    assert plain.outcome == "completed" and plain.reward == 1.0, plain.error
    assert _started(llm) - before == 4

    before = _started(llm)
    job, rid = _submit(service, llm)
    deadline = time.monotonic() + 60
    while len(_turns(service, rid)) < 2:
        assert time.monotonic() < deadline, service.log_tail()
        time.sleep(0.05)
    service.kill_worker("run", "node-a")  # SIGKILL while turn 2 is being generated
    service.start_worker("run", "node-a", 2)
    service.wait_done(job, timeout=120)
    resumed = service.client.rollout(rid)

    for name in ARRAYS:
        assert getattr(resumed, name) == getattr(plain, name), name
    assert resumed.attempt == 1 and not resumed.earlier_attempts  # no new INIT
    assert _turns(service, rid) == [(1, 0), (1, 1), (1, 2), (1, 3)]  # no index repeated
    assert resumed.turns[2].observation.strip() == "42"  # x survived: same sandbox
    assert resumed.metrics["resumed_from_turn"] == 2
    assert 4 <= _started(llm) - before <= 5  # 4 turns (+ the one in flight at the kill)
    with session_scope(service.settings.db_url) as s:
        [entry] = s.get(Rollout, rid).resumes
    assert entry["attempt"] == 1 and entry["from_turn"] == 2
    assert "stopped beating" in entry["error"]


def test_a_retryable_error_in_run_resumes_without_the_reaper(service, llm) -> None:
    job, plain_id = _submit(service, llm)
    service.wait_done(job, timeout=120)
    plain = service.client.rollout(plain_id)
    before = _started(llm)
    job, rid = _submit(service, llm, agent="test-flaky-math")
    service.wait_done(job, timeout=120)
    resumed = service.client.rollout(rid)
    for name in ARRAYS:
        assert getattr(resumed, name) == getattr(plain, name), name
    assert resumed.attempt == 1 and resumed.metrics["resumed_from_turn"] == 2
    assert _turns(service, rid) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert _started(llm) - before == 4  # the error fell between turns: nothing generated twice
    with session_scope(service.settings.db_url) as s:
        [entry] = s.get(Rollout, rid).resumes
    assert "injected" in entry["error"]


def test_a_retryable_error_in_eval_grades_again_without_a_new_run(service, llm) -> None:
    before = _started(llm)
    job, rid = _submit(service, llm, agent="test-flaky-grader")
    service.wait_done(job, timeout=120)
    view = service.client.rollout(rid)
    assert (view.outcome, view.reward, view.attempt) == ("completed", 1.0, 1)
    assert _started(llm) - before == 4  # RUN ran once
    with session_scope(service.settings.db_url) as s:
        [entry] = s.get(Rollout, rid).resumes
    assert entry["stage"] == "eval" and "injected" in entry["error"]
