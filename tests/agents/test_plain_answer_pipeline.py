"""`plain_answer` (and `math` with `tools: []`) through the real pipeline: no sandbox started.

Gateway, Celery worker processes per stage, the embedded database and broker, and the LLM
simulator (a fake vLLM, named as such) answering the arithmetic set's questions. The node's
default sandbox runtime is `singularity`, which is not installed here: any INIT that tried to
start a sandbox would fail, so rollouts that complete with the right rewards prove none was
started (and the node's workspace folder stays empty).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fakellm.server import start_simulator
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
TRAIN = {r["instance_id"]: r for r in map(json.loads, (REPO / "examples/arith/train.jsonl").read_text().splitlines())}
RIGHT, WRONG, RAMBLE = "arith-add-3-5", "arith-mul-7-8", "arith-mul-2-9"
LLM = {"tokenizer": SMOLLM2, "max_model_len": 2048}


def instance(instance_id: str) -> dict:
    return {"instance_id": instance_id, "data": {k: v for k, v in TRAIN[instance_id].items() if k != "instance_id"}}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A node whose sandboxes cannot start (no apptainer/singularity on this machine)."""
    assert not any(
        os.access(Path(d, name), os.X_OK) for d in os.get_exec_path() for name in ("apptainer", "singularity")
    ), "needs a machine without singularity"
    svc = start_service(
        tmp_path_factory.mktemp("plain-answer"), concurrency=2, extra={"sandbox_runtime": "singularity"}
    )
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def simulator_url():
    script = {
        "by_instance": {
            TRAIN[RIGHT]["question"]: ["3 + 5 = 8"],
            TRAIN[WRONG]["question"]: ["The answer is 54."],
            # cut at max_tokens before finishing: not graded, even though it printed 18
            TRAIN[RAMBLE]["question"]: [
                "2 * 9 = 18. Let me check that again very carefully, "
                "step by step, because arithmetic is tricky and " * 4
            ],
            "What is 4 + 4?": ["\\boxed{8}"],
        }
    }
    url, stop = start_simulator(SMOLLM2, script)
    yield url
    stop()


def test_plain_answer_grades_the_last_number_without_a_sandbox(service, simulator_url) -> None:
    accepted = service.client.submit(
        "plain_answer",
        [instance(i) for i in (RIGHT, WRONG, RAMBLE)],
        n_samples=2,
        sampling={"max_tokens": 24},
        llm={**LLM, "servers": [{"url": simulator_url}]},
    )
    job = service.wait_done(accepted.job_id, timeout=120)
    assert job.counts == {"done": 6}, service.log_tail()
    results = service.all_results(accepted.job_id)
    rewards = {(r.instance_id, r.reward) for r in results}
    assert rewards == {(RIGHT, 1.0), (WRONG, 0.0), (RAMBLE, 0.0)}
    for r in results:
        assert r.outcome == "completed"
        assert sum(r.loss_mask) > 0 and len(r.response_logprobs) == len(r.response_ids)
        assert r.policy_versions and len(r.policy_versions) == 1  # one turn, one version
    right = next(r for r in results if r.instance_id == RIGHT)
    detail = service.client.rollout(right.rollout_id)
    assert detail.extra["predicted_answer"] == "8" and len(detail.turns) == 1
    assert not list(service.settings.workspaces.glob("*")), "a sandbox workspace was made"


def test_math_without_tools_starts_no_sandbox(service, simulator_url) -> None:
    accepted = service.client.submit(
        "math",
        [{"instance_id": "m1", "data": {"problem": "What is 4 + 4?", "answer": "8"}}],
        n_samples=2,
        agent_config={"tools": []},
        llm={**LLM, "servers": [{"url": simulator_url}]},
    )
    job = service.wait_done(accepted.job_id, timeout=120)
    assert job.counts == {"done": 2}, service.log_tail()
    assert [r.reward for r in service.all_results(accepted.job_id)] == [1.0, 1.0]
    assert not list(service.settings.workspaces.glob("*")), "a sandbox workspace was made"
