"""`math` end to end through the real pipeline: gateway, Celery workers, bwrap sandboxes.

The handler's default config is used, so the sandbox gets the environment named `math` from
the node's `<RAAS home>/envs` (here a link to the shared test build of sympy + numpy). The LLM
simulator (a fake vLLM, named as such) is scripted per problem to succeed or to fail.
The run against SmolLM2 on a real vLLM is `tests/agents/test_vllm_smoke.py` (marked `vllm`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fakellm.server import start_simulator
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
PROBLEMS = {p["instance_id"]: p for p in map(json.loads, (REPO / "examples" / "math.jsonl").read_text().splitlines())}


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def instance(instance_id: str) -> dict:
    data = {k: v for k, v in PROBLEMS[instance_id].items() if k != "instance_id"}
    return {"instance_id": instance_id, "data": data}


CODE = "import sympy as sp\nx = sp.Symbol('x')\nprint(sp.integrate(x*sp.exp(x), (x, 0, 1)))"
SCRIPT = {
    "by_instance": {
        PROBLEMS["math-008"]["problem"]: [call("python", code=CODE), call("finish", answer="1")],
        PROBLEMS["math-009"]["problem"]: [call("finish", answer="3")],
        PROBLEMS["math-022"]["problem"]: ["The sum is 3/(1 - 1/3) = \\boxed{\\frac{9}{2}}"],
        PROBLEMS["math-001"]["problem"]: [{"text": call("python", code="print(1)"), "latency": 0.5}],
    }
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, built_env):
    """One service for the module; its `math` environment links to the shared test build."""
    home = tmp_path_factory.mktemp("math-pipeline")
    envs = home / "envs"
    envs.mkdir()
    (envs / "math").symlink_to(built_env("math", ["sympy", "numpy"]))
    svc = start_service(home, concurrency=2)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
    stop()


def test_math_jobs_run_to_rewards_in_sandboxes(service, llm) -> None:
    ids = ["math-008", "math-009", "math-022"]
    accepted = service.client.submit("math", [instance(i) for i in ids], limits={"max_turns": 4}, llm=llm)
    job = service.wait_done(accepted.job_id, timeout=120)
    assert job.counts == {"done": 3}, service.log_tail()
    assert job.outcomes == {"completed": 3}
    by_id = {r.instance_id: r for r in service.all_results(accepted.job_id)}
    assert {i: by_id[i].reward for i in ids} == {"math-008": 1.0, "math-009": 0.0, "math-022": 1.0}
    detail = service.client.rollout(by_id["math-008"].rollout_id)
    assert detail.turns[0].observation.strip() == "1"  # sympy ran in the sandbox
    assert detail.metrics["graded_by"] == "exact"  # the reference is the integer 1


def test_cancel_mid_run(service, llm) -> None:
    accepted = service.client.submit("math", [instance("math-001")], llm=llm, limits={"max_turns": 200})
    rollout_id = accepted.rollout_ids[0]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(service.client.rollout(rollout_id).turns) < 2:
        time.sleep(0.2)
    service.client.cancel(accepted.job_id)
    job = service.wait_done(accepted.job_id, timeout=120)
    detail = service.client.rollout(rollout_id)
    assert detail.outcome == "cancelled" and job.outcomes == {"cancelled": 1}
    assert 2 <= len(detail.turns) < 200
