"""Issue 12 end to end (gateway, Celery workers, bwrap sandboxes, the LLM simulator as vLLM).

* a prompt that cannot fit is rejected at submission when the server reports its context,
  and otherwise ends `prompt_too_long` (ungraded, reward null) while its neighbours complete;
* weight updates without restarts: the trainer pauses the registered server, rollouts wait
  (no new request, no failure, no new attempt), it resumes with a new weight_version, and the
  turns record v1 then v2; `limits.max_staleness` marks the rollouts that spanned the update.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakellm.server import start_simulator
from raas_client.sdk import RaasHTTPError
from bench.support.pipeline_harness import start_service
from raas_client.models import TurnView

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
HUGE = "Compute the sum of the following numbers: " + " + ".join(["1"] * 1500)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def math(instance_id: str, problem: str, answer: str = "3") -> dict:
    return {"instance_id": instance_id, "data": {"problem": problem, "answer": answer}}


SCRIPT = {
    "by_instance": {
        "What is 1 + 2?": [call("finish", answer="3")],
        "Count slowly": [{"text": call("python", code="print(1)"), "latency": 0.4}] * 5 + [call("finish", answer="5")],
    }
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, built_env):
    home = tmp_path_factory.mktemp("edges-pipeline")
    (home / "envs").mkdir()
    (home / "envs" / "math").symlink_to(built_env("math", ["sympy", "numpy"]))
    svc = start_service(home, concurrency=2)
    yield svc
    svc.stop()


def test_prompt_that_cannot_fit_is_rejected_at_submission(service) -> None:
    url, stop = start_simulator(SMOLLM2, SCRIPT, max_model_len=1500)
    try:
        llm = {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 8192}
        with pytest.raises(RaasHTTPError) as err:
            service.client.submit("math", [math("ok", "What is 1 + 2?"), math("huge", HUGE)], llm=llm)
        assert err.value.status == 400
        message = err.value.body["message"]
        assert "instances[1] (huge)" in message and "1500" in message
        accepted = service.client.submit("math", [math("ok", "What is 1 + 2?")], llm=llm)
        job = service.wait_done(accepted.job_id, timeout=120)
        assert job.outcomes == {"completed": 1}, service.log_tail()
    finally:
        stop()


def test_prompt_too_long_when_the_limit_is_unknown_is_not_a_sample(service) -> None:
    url, stop = start_simulator(SMOLLM2, SCRIPT, max_model_len=1500, report_max_model_len=False)
    try:
        llm = {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 8192}
        accepted = service.client.submit(
            "math", [math("ok", "What is 1 + 2?"), math("huge", HUGE)], llm=llm, sampling={"max_tokens": 1400}
        )  # prompt + 1400 > 1500: the server says 400
        job = service.wait_done(accepted.job_id, timeout=120)
        by_id = {r.instance_id: r for r in service.all_results(accepted.job_id)}
        huge, ok = by_id["huge"], by_id["ok"]
        assert (huge.status, huge.outcome, huge.finish_reason) == ("failed", "prompt_too_long", "context")
        assert huge.reward is None and "does not fit the context (1500 tokens)" in huge.error
        assert huge.response_ids == [] and huge.prompt_ids
        # The neighbour learnt the limit from vLLM's 400 and still completed, graded.
        assert (ok.outcome, ok.reward, ok.finish_reason) == ("completed", 1.0, "finish")
        assert ok.metrics["context_length"] == 1500
        assert job.outcomes == {"completed": 1, "prompt_too_long": 1}
    finally:
        stop()


def _turns(service, rollout_id: str) -> list[TurnView]:
    return service.client.rollout(rollout_id).turns or []


def test_weight_update_pauses_and_resumes_without_restarts(service) -> None:
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    try:
        server = service.client.add_llm_server(url, weight_version="v1")
        accepted = service.client.submit(
            "math",
            [math("slow", "Count slowly to 5", "5")],
            n_samples=2,
            llm={"tokenizer": SMOLLM2, "max_model_len": 4096},
            limits={"max_turns": 10, "max_staleness": 0},
        )
        ids = accepted.rollout_ids
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(len(_turns(service, r)) >= 2 for r in ids):
            time.sleep(0.1)
        assert all(len(_turns(service, r)) >= 2 for r in ids), service.log_tail()
        service.client.pause_llm_server(server.id)
        time.sleep(1.0)  # requests already sent finish (one per rollout at most)
        before = httpx.get(f"{url}/sim/stats").json()["requests"]
        turns_before = {r: len(_turns(service, r)) for r in ids}
        time.sleep(3.0)
        assert httpx.get(f"{url}/sim/stats").json()["requests"] == before  # nothing new sent
        for rid in ids:  # waiting, not failed or retried
            view = service.client.rollout(rid)
            assert (view.status, view.attempt) == ("run", 1)
            assert len(view.turns) <= turns_before[rid] + 1
        service.client.resume_llm_server(server.id, weight_version="v2")
        job = service.wait_done(accepted.job_id, timeout=120)
        assert job.outcomes == {"completed": 2}, service.log_tail()
        for rid in ids:
            view = service.client.rollout(rid)
            versions = [t.weight_version for t in view.turns]
            assert view.attempt == 1 and view.earlier_attempts == []
            assert versions[0] == "v1" and versions[-1] == "v2"
            assert versions == sorted(versions)  # v1 ... v1, v2 ... v2: one switch
            assert view.policy_versions == versions
            assert view.reward == 1.0 and view.error is None
            assert (view.metrics["staleness"], view.metrics["stale"]) == (1, True)
            assert view.metrics["weight_versions"] == ["v1", "v2"]
            assert view.metrics["logprobs_mode"] == "raw_logprobs"
    finally:
        stop()
