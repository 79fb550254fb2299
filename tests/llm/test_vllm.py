"""Real-LLM tier: multi-turn rollouts against a real vLLM (SmolLM2 on CPU), `RAAS_VLLM_URL`.

Run: `RAAS_VLLM_URL=http://127.0.0.1:8000 .venv/bin/python -m pytest -m vllm tests/llm`
(start the server with `make vllm-cpu` or `scripts/serve_vllm_cpu.sh`).
"""

from __future__ import annotations

import math
import os
from functools import partial

import httpx
import pytest

from agents.llm import LLMSession, validate_llm_spec
from core.db import session_scope
from core.models import LLMServer
from tasks.llm.llm_pool import registered_urls
from tests.llm.conftest import TOOLS, deadline
from tests.llm.test_pool import make_rollouts, open_session

pytestmark = pytest.mark.vllm
VLLM_URL = os.environ.get("RAAS_VLLM_URL", "")
PROMPT = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "What is the capital of France? Then name a river there."},
]


@pytest.fixture
def vllm_db(db_url: str) -> str:
    if not VLLM_URL:
        pytest.fail("RAAS_VLLM_URL is not set: the vllm tier needs a real server")
    model = httpx.get(f"{VLLM_URL}/v1/models", timeout=10).json()["data"][0]["id"]
    with session_scope(db_url) as db:
        db.add(LLMServer(url=VLLM_URL.rstrip("/"), model=model, weight_version="smollm2-q4"))
    return db_url


def leased_session(spec: dict, sampling: dict, db_url: str) -> LLMSession:
    """A session on the registered pool for a fresh leased rollout, as the RUN stage opens it."""
    (rollout_id,) = make_rollouts(db_url, 1)
    return open_session(spec, rollout_id, db_url, sampling)


def test_multi_turn_rollout_is_token_exact(vllm_db: str) -> None:
    # The tokenizer comes from the registered server's GET /v1/models.
    spec = validate_llm_spec({"max_model_len": 2048}, partial(registered_urls, vllm_db))
    assert os.path.isdir(spec["tokenizer"])
    sampling = {"temperature": 1.0, "max_tokens": 40, "seed": 7}
    with leased_session(spec, sampling, vllm_db) as s:
        s.start(PROMPT, TOOLS)
        generations = []
        for turn in range(3):
            generations.append(s.generate(deadline(120)))
            if turn < 2:
                s.append_messages([{"role": "user", "content": "Tell me one more fact."}])
        traj = s.trajectory()
        for generation, (start, end) in zip(generations, traj.turn_boundaries):
            assert traj.response_ids[start:end] == generation.token_ids  # as the server sent them
            assert traj.response_logprobs[start:end] == generation.logprobs
            assert all(math.isfinite(x) and x <= 0 for x in generation.logprobs)
            assert generation.weight_version == "smollm2-q4"
        generated = {i for start, end in traj.turn_boundaries for i in range(start, end)}
        assert {i for i, m in enumerate(traj.loss_mask) if m} == generated
        assert len(traj.loss_mask) == len(traj.response_ids) == len(traj.response_logprobs)
        report = s.audit_drift()
        assert set(report) == {"retokenization_drift", "first_diff", "drift_turns", "forged_control_tokens"}
        assert isinstance(report["retokenization_drift"], int)


def test_greedy_turn_matches_a_direct_request(vllm_db: str) -> None:
    spec = validate_llm_spec({"max_model_len": 2048}, partial(registered_urls, vllm_db))
    with leased_session(spec, {"temperature": 0.0, "max_tokens": 24}, vllm_db) as s:
        s.start(PROMPT)
        prompt_ids = list(s.trajectory().prompt_ids)
        generation = s.generate(deadline(120))
        body = {
            "model": s.server.model,
            "prompt": prompt_ids,
            "max_tokens": 24,
            "temperature": 0.0,
            "logprobs": 0,
            "return_token_ids": True,
        }
        direct = httpx.post(f"{VLLM_URL}/v1/completions", json=body, timeout=120).json()
        assert generation.token_ids == direct["choices"][0]["token_ids"]


def test_length_stop_against_real_server(vllm_db: str) -> None:
    spec = validate_llm_spec({"max_model_len": 2048}, partial(registered_urls, vllm_db))
    with leased_session(spec, {"temperature": 1.0, "max_tokens": 4}, vllm_db) as s:
        s.start(PROMPT)
        generation = s.generate(deadline(120))
        assert generation.finish_reason == "length" and len(generation.token_ids) == 4
        delta = s.append_messages([{"role": "user", "content": "Go on."}])
        assert delta[0] == 2  # <|im_end|> closes the cut turn, mask 0
        s.generate(deadline(120))
        assert s.audit_drift()["retokenization_drift"] >= 0


def test_server_context_caps_every_request(vllm_db: str) -> None:
    """Issue 12 case 1 on a real vLLM: the job asks 8192, the server's max_model_len wins."""
    served = httpx.get(f"{VLLM_URL}/v1/models", timeout=10).json()["data"][0]["max_model_len"]
    spec = validate_llm_spec({"max_model_len": 8192}, partial(registered_urls, vllm_db))
    with leased_session(spec, {"temperature": 1.0, "max_tokens": 4096}, vllm_db) as s:
        s.start(PROMPT, TOOLS)
        generation = s.generate(deadline(600))  # asks for at most what fits: no HTTP 400
        assert s.context_length == served
        assert generation.finish_reason in ("stop", "context")
        traj = s.trajectory()
        assert len(traj.prompt_ids) + len(traj.response_ids) <= served


def test_prompt_longer_than_the_server_context_generates_nothing(vllm_db: str) -> None:
    """Issue 12 case 2: an empty `context` generation, never an HTTP 400 or a reward-0 turn."""
    spec = validate_llm_spec({"max_model_len": 100_000}, partial(registered_urls, vllm_db))
    long_prompt = [{"role": "user", "content": "word " * 20_000}]
    with leased_session(spec, {"max_tokens": 16}, vllm_db) as s:
        s.start(long_prompt)
        generation = s.generate(deadline(120))
        assert (generation.token_ids, generation.finish_reason) == ([], "context")


def test_generated_token_budget_caps_the_request(vllm_db: str) -> None:
    """Issue 12 case 3: max_new_tokens (what limits.max_tokens leaves) caps the request."""
    spec = validate_llm_spec({"max_model_len": 2048}, partial(registered_urls, vllm_db))
    with leased_session(spec, {"temperature": 1.0, "max_tokens": 512, "seed": 3}, vllm_db) as s:
        s.start(PROMPT)
        generation = s.generate(deadline(120), max_new_tokens=5)
        assert len(generation.token_ids) <= 5
        assert generation.finish_reason in ("stop", "token_budget")


def test_a_streamed_turn_is_the_non_streamed_one(vllm_db: str) -> None:
    # vLLM streams `token_ids` and `logprobs` per chunk (`return_token_ids`): the streamed
    # turn's ids are the same seeded sample's, its logprobs the same within float32 noise.
    from agents.llm.backends import GenerateRequest, get_backend_class

    spec = validate_llm_spec({"max_model_len": 2048}, partial(registered_urls, vllm_db))
    with leased_session(spec, {"temperature": 1.0, "max_tokens": 40, "seed": 11}, vllm_db) as s:
        s.start(PROMPT)
        prompt_ids = list(s.trajectory().prompt_ids)
    model = httpx.get(f"{VLLM_URL}/v1/models", timeout=10).json()["data"][0]["id"]
    backend = get_backend_class("vllm")()
    pieces: list[str] = []

    def request(on_delta=None) -> GenerateRequest:
        sampling = {"temperature": 1.0, "seed": 11}
        return GenerateRequest(prompt_ids, 40, sampling, timeout=120, model=model, on_delta=on_delta)

    whole = backend.generate(VLLM_URL, request())
    streamed = backend.generate(VLLM_URL, request(pieces.append))
    assert streamed.token_ids == whole.token_ids and len(pieces) > 1
    assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(streamed.logprobs, whole.logprobs))
    assert streamed.finish_reason == whole.finish_reason
