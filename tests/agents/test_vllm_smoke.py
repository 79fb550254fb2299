"""Smoke tier: every handler through the real pipeline against SmolLM2 on a real CPU vLLM.

Real gateway, real Celery worker processes per stage, real bwrap sandboxes, real evaluation,
and a real model (no simulator). The small model's reward is whatever it is; what must hold
is that each rollout reaches an outcome with a token-exact trajectory: the generated spans of
`response_ids` are exactly the per-turn `generated_ids` stored in the turn log, the loss mask
covers exactly those spans, every logprob is finite, and the drift audit ran.

    scripts/serve_vllm_cpu.sh models/smollm2-135m-instruct 8011 &   # ready after ~2 min
    RAAS_VLLM_URL=http://127.0.0.1:8011 .venv/bin/python -m pytest -m vllm \\
        tests/agents/test_vllm_smoke.py
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from raas_client.cli import read_instances
from bench.support.pipeline_harness import Service, start_service
from raas_client.models import RolloutView

pytestmark = [pytest.mark.service, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
VLLM_URL = os.environ.get("RAAS_VLLM_URL", "").rstrip("/")
MAX_MODEL_LEN = 2048  # what scripts/serve_vllm_cpu.sh serves
AGENT_OUTCOMES = {"completed", "agent_error", "timeout"}  # never infra_error or cancelled

# agent -> (example set, instance ids); each instance runs twice (a GRPO group of 2).
SMOKE_SETS = {
    "math": ("examples/math.jsonl", ["math-004", "math-011"]),
    "code": ("examples/code.jsonl", ["code-fizzbuzz", "code-palindrome"]),
    "swe": ("examples/swe/instances.jsonl", ["raas-examples__intervals-1", "raas-examples__slugify-1"]),
    "search": ("examples/search/questions.jsonl", ["search-003", "search-020"]),
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, built_env: Any) -> Service:
    """One service for the module, with the `math` and `pytest` environments the handlers use."""
    home = tmp_path_factory.mktemp("vllm-smoke")
    envs = home / "envs"
    envs.mkdir()
    (envs / "math").symlink_to(built_env("math", ["sympy", "numpy"]))
    (envs / "pytest").symlink_to(built_env("pytest", ["pytest"]))
    svc = start_service(home, concurrency={"init": 2, "run": 4, "eval": 2})
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm() -> dict[str, Any]:
    """The job's `llm` spec: the real vLLM server, SmolLM2's tokenizer."""
    if not VLLM_URL:
        pytest.fail("RAAS_VLLM_URL is not set: the vllm tier needs a real server")
    return {"servers": [{"url": VLLM_URL}], "tokenizer": SMOLLM2, "max_model_len": MAX_MODEL_LEN}


def smoke_instances(path: str, ids: list[str]) -> list[dict[str, Any]]:
    """The named instances of an example set, in the shape `raas submit` sends."""
    by_id = {item["instance_id"]: item for item in read_instances(REPO / path)}
    return [by_id[i] for i in ids]


def check_token_exact(detail: RolloutView) -> None:
    """The stored trajectory is exactly what the server generated, turn by turn."""
    response, mask = detail.response_ids or [], detail.loss_mask or []
    logprobs = detail.response_logprobs or []
    assert detail.token_exact is True
    assert len(mask) == len(response) == len(logprobs) and sum(mask) > 0
    assert all(math.isfinite(x) for x in logprobs)
    turns = [t for t in detail.turns or [] if t.attempt == detail.attempt]
    generated = [t for t in turns if t.generated_ids]
    spans = detail.extra["turn_boundaries"]
    assert [response[s:e] for s, e in spans] == [t.generated_ids for t in generated]
    assert [logprobs[s:e] for s, e in spans] == [t.logprobs for t in generated]
    assert {i for i, m in enumerate(mask) if m} == {i for s, e in spans for i in range(s, e)}
    assert isinstance(detail.metrics["retokenization_drift"], int)  # the drift audit ran
    assert "first_diff" in detail.metrics


@pytest.mark.timeout(900)
@pytest.mark.parametrize("agent", list(SMOKE_SETS))
def test_agent_smoke_on_vllm(service: Service, llm: dict[str, Any], agent: str) -> None:
    path, ids = SMOKE_SETS[agent]
    accepted = service.client.submit(
        agent,
        smoke_instances(path, ids),
        n_samples=2,
        llm=llm,
        limits={"max_turns": 3, "max_tokens": 1024, "tool_timeout": 20},
        sampling={"temperature": 1.0, "max_tokens": 256},
    )
    job = service.wait_done(accepted.job_id, timeout=840)
    assert job.counts == {"done": len(accepted.rollout_ids)}, service.log_tail()
    for rollout_id in accepted.rollout_ids:
        detail = service.client.rollout(rollout_id)
        assert detail.outcome in AGENT_OUTCOMES, (detail.outcome, detail.error)
        assert detail.reward is not None and 0.0 <= detail.reward <= 1.0
        assert detail.timing.run is not None and detail.timing.eval is not None
        check_token_exact(detail)
