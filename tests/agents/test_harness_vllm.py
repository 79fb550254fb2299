"""Real model tier of the harness agent: mini-swe-agent and the openai-SDK agent, unmodified,
against SmolLM2 on a real CPU vLLM (marker `vllm`, not in `make test`).

The small model's reward is whatever it is; what must hold is that every captured call is
token-exact: each sample's `response_ids` spans are exactly the generated ids of its calls
(the turn log) with their logprobs, the sample is one prefix-consistent sequence (its first
call's prompt, then each call's generated ids and the next call's delta), and re-scoring the
stored sequence with the server (`prompt_logprobs`) gives the stored logprobs back (an fp32
server: `--dtype float32`). mini-swe-agent drops its own replies that hit the token limit or
carry no tool call from the history it sends next, so its rollouts split into several samples
(`history_rewritten`): each is checked on its own. Figures
are printed as JSON lines (`-s`): calls, samples, merges, splits, the re-score's max |diff|.

    scripts/serve_vllm_cpu.sh models/smollm2-135m-instruct 8231 float32 &   # ready in ~3-7 min
    RAAS_VLLM_URL=http://127.0.0.1:8231 .venv/bin/python -m pytest -m vllm -s \\
        tests/agents/test_harness_vllm.py
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agents.test_harness_pipeline import ENVS, INTERVALS, QWEN_TEMPLATE, SWE, as_instance
from bench.support.pipeline_harness import Service, start_service
from raas_client.models import RolloutView, TrainingSample, TurnView

pytestmark = [pytest.mark.service, pytest.mark.vllm, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
VLLM_URL = os.environ.get("RAAS_VLLM_URL", "").rstrip("/")
# fp32 on both sides, as the training tier checks (tests/train): a bf16 server's prefill and
# decode differ by up to ~0.3 on this model, which says nothing about the capture.
RESCORE_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Service:
    from sandbox.environments import build_environment

    home = tmp_path_factory.mktemp("harness-vllm")
    (home / "envs").mkdir()
    for name, packages in ENVS.items():
        folder = name if name == "pytest" else f"harness-{name}"
        (home / "envs" / name).symlink_to(build_environment(folder, packages))
    svc = start_service(home, concurrency={"init": 2, "run": 2, "eval": 2})
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm() -> dict[str, Any]:
    if not VLLM_URL:
        pytest.fail("RAAS_VLLM_URL is not set: the vllm tier needs a real server")
    return {
        "servers": [{"url": VLLM_URL}],
        "tokenizer": SMOLLM2,
        "max_model_len": 2048,
        "chat_template_text": QWEN_TEMPLATE,
    }  # renders the harness's tools


def samples_of(detail: RolloutView) -> list[TrainingSample]:
    """Every training sample of a rollout (the main arrays are the last one)."""
    return detail.samples or [
        TrainingSample(
            prompt_ids=detail.prompt_ids or [],
            response_ids=detail.response_ids or [],
            response_logprobs=detail.response_logprobs or [],
            loss_mask=detail.loss_mask or [],
            turn_boundaries=detail.turn_boundaries,
        )
    ]


def calls_by_sample(turns: list[TurnView]) -> list[list[TurnView]]:
    """The logged calls grouped into samples, in order: a call logged with its whole prompt
    starts a sample, one logged with a delta extends the current one."""
    groups: list[list[TurnView]] = []
    for turn in sorted(turns, key=lambda t: t.index):
        if "prompt_ids" in turn.extra or not groups:
            groups.append([])
        groups[-1].append(turn)
    return groups


def check_sample(sample: TrainingSample, turns: list[TurnView]) -> None:
    """Token-exact and prefix-consistent: the arrays are the calls' own tokens, in order."""
    response, mask, logprobs = (sample.response_ids, sample.loss_mask, sample.response_logprobs)
    assert len(response) == len(mask) == len(logprobs) and all(map(math.isfinite, logprobs))
    spans = sample.turn_boundaries
    assert [response[s:e] for s, e in spans] == [t.generated_ids for t in turns]
    assert [logprobs[s:e] for s, e in spans] == [t.logprobs for t in turns]
    assert {i for i, m in enumerate(mask) if m} == {i for s, e in spans for i in range(s, e)}
    sequence: list[int] = []
    for turn in turns:  # first call: its whole prompt; later ones: the delta after the reply
        sequence += turn.extra.get("prompt_ids") if not sequence else turn.extra.get("delta_ids") or []
        sequence += turn.generated_ids or []
    assert sample.prompt_ids + response == sequence[: len(sample.prompt_ids + response)]


def rescore(sample: TrainingSample, model: str) -> float:
    """Max |stored - re-scored| logprob over the sample's generated tokens."""
    ids = sample.prompt_ids + sample.response_ids
    reply = httpx.post(
        f"{VLLM_URL}/v1/completions",
        timeout=600,
        json={"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0},
    ).json()
    scored = reply["choices"][0]["prompt_logprobs"]
    start = len(sample.prompt_ids)
    worst = 0.0
    for i, (token, kept) in enumerate(zip(sample.response_ids, sample.response_logprobs)):
        if sample.loss_mask[i]:
            worst = max(worst, abs(scored[start + i][str(token)]["logprob"] - kept))
    return worst


@pytest.mark.parametrize("harness", ["openai-agent", "mini-swe-agent"])
def test_a_real_harness_on_the_real_model_is_token_exact(service, llm, harness) -> None:
    accepted = service.client.submit(
        "harness",
        [as_instance(INTERVALS, SWE)],
        n_samples=2,
        llm=llm,
        limits={"max_tokens": 1024},
        sampling={"temperature": 1.0, "max_tokens": 256},
        agent_config={"harness": harness, "task": "swe"},
    )
    job = service.wait_done(accepted.job_id, timeout=1500)
    assert job.counts == {"done": 2} or set(job.counts) <= {"done", "failed"}, job
    model = httpx.get(f"{VLLM_URL}/v1/models").json()["data"][0]["id"]
    for rollout_id in accepted.rollout_ids:
        detail = service.client.rollout(rollout_id)
        assert detail.outcome in {"completed", "agent_error", "timeout"}, detail.error
        turns = [t for t in detail.turns if t.attempt == detail.attempt]
        assert turns, "the harness made no call"
        samples = samples_of(detail)
        groups = calls_by_sample(turns)
        assert len(groups) == len(samples) == detail.metrics["samples"]
        assert detail.metrics["splits"] == len(samples) - 1
        worst = 0.0
        for sample, calls in zip(samples, groups):
            check_sample(sample, calls)
            worst = max(worst, rescore(sample, model))
        assert worst <= RESCORE_TOLERANCE, worst
        metrics = detail.metrics
        print(
            json.dumps(
                {
                    "harness": harness,
                    "outcome": detail.outcome,
                    "reward": detail.reward,
                    "calls": metrics["calls"],
                    "samples": len(samples),
                    "merges": metrics["merges"],
                    "splits": metrics["splits"],
                    "tool_calls": metrics["tool_calls"],
                    "malformed_tool_calls": metrics["malformed_tool_calls"],
                    "response_tokens": metrics.get("response_tokens"),
                    "rescore_max_abs_diff": round(worst, 5),
                }
            )
        )
