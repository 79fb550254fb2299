"""`search` end to end through the real pipeline: gateway, Celery workers, DB, simulator LLM.

The embedded default (SQLite + embedded Redis), real worker processes per stage; the LLM
simulator (a fake vLLM, named as such) is scripted per question to succeed or to fail.
The run against SmolLM2 on a real vLLM is `tests/agents/test_vllm_smoke.py` (marked `vllm`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakellm.server import start_simulator
from raas_client.sdk import RaasHTTPError
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
QUESTIONS_FILE = REPO / "examples" / "search" / "questions.jsonl"
QUESTIONS = {q["instance_id"]: q for q in map(json.loads, QUESTIONS_FILE.read_text().splitlines())}


def call(name: str, **arguments: str) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One service for the module."""
    svc = start_service(tmp_path_factory.mktemp("search-pipeline"), concurrency=2)
    yield svc
    svc.stop()


@pytest.fixture
def simulator_url():
    good, bad = QUESTIONS["search-003"], QUESTIONS["search-016"]
    script = {
        "by_instance": {
            good["question"]: [call("search", query=good["query"]), call("answer", text="128")],
            bad["question"]: [call("search", query=bad["query"]), call("answer", text="uuid1")],
        }
    }
    url, stop = start_simulator(SMOLLM2, script)
    yield url
    stop()


def test_search_jobs_run_to_rewards(service, simulator_url) -> None:
    instances = [
        {"instance_id": i, "data": {k: v for k, v in QUESTIONS[i].items() if k != "instance_id"}}
        for i in ("search-003", "search-016")
    ]
    accepted = service.client.submit(
        "search",
        instances,
        n_samples=2,
        limits={"max_turns": 4},
        llm={"servers": [{"url": simulator_url}], "tokenizer": SMOLLM2, "max_model_len": 4096},
    )
    job = service.wait_done(accepted.job_id, timeout=120)
    failed = [service.client.rollout(r) for r in accepted.rollout_ids]
    failed = [(r.error, r.outcome) for r in failed if r.status != "done"]
    assert job.counts == {"done": 4}, (failed, service.log_tail())
    assert job.outcomes == {"completed": 4}
    results = service.all_results(accepted.job_id)
    rewards = {(r.instance_id, r.reward) for r in results}
    assert rewards == {("search-003", 1.0), ("search-016", 0.0)}
    for r in results:
        assert r.response_ids and len(r.loss_mask) == len(r.response_ids)
    detail = service.client.rollout(results[0].rollout_id)
    assert [t.index for t in detail.turns] == [0, 1]
    assert detail.metrics["gold_passage_retrieved"] is True


@pytest.mark.parametrize(
    "body, field",
    [
        ({"instances": [{"instance_id": "x", "data": {"question": "q"}}]}, "instance.answer"),
        ({"agent_config": {"reward": "bleu"}}, "agent_config.reward"),
    ],
)
def test_bad_search_jobs_are_rejected_at_submission(service, body, field) -> None:
    job = {
        "instances": [{"instance_id": "x", "data": {"question": "q", "answers": ["a"]}}],
        "llm": {"servers": [{"url": "http://127.0.0.1:9"}], "tokenizer": SMOLLM2},
        **body,
    }
    with pytest.raises(RaasHTTPError) as err:
        service.client.submit("search", job.pop("instances"), **job)
    assert err.value.status == 400
    assert field in json.dumps(err.value.body)
