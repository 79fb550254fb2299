"""LLMSession against the LLM simulator over real HTTP: exact ids, backends, limits, spec."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from agents.llm import LLMSession, SamplingParams, parse_tool_calls, validate_llm_spec
from agents.llm.spec import validate_sampling
from core.db import session_scope
from core.errors import InvalidRequest, StageTimeout
from core.models import LLMServer
from tasks.llm.llm_pool import registered_urls
from tests.llm.conftest import QWEN_TEMPLATE, SMOLLM2, TOOLS, deadline

CALLS = (
    '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>\n'
    '<tool_call>{"name": "bash", "arguments": {"cmd": "pwd"</tool_call>'
)
SCRIPT = {"by_instance": {"task-1": [CALLS, "All done."]}}
PROMPT = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "task-1: look"}]


def ids_of(text: str) -> list[int]:
    return Tokenizer.from_file(f"{SMOLLM2}/tokenizer.json").encode(text, add_special_tokens=False).ids


def spec_for(url: str, **extra) -> dict:
    return {"servers": [{"url": url, "weight_version": "step-3"}], "tokenizer": SMOLLM2, "max_model_len": 2048, **extra}


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_multi_turn_rollout_is_token_exact(simulators, backend) -> None:
    url, _ = simulators(SCRIPT)
    with LLMSession.open(spec_for(url, backend=backend), {"max_tokens": 200}, "r1") as s:
        s.start(PROMPT, TOOLS)
        first = s.generate(deadline())
        assert first.token_ids == ids_of(CALLS) + [2]  # exactly what the server returned
        assert first.server == url and first.weight_version == "step-3"
        assert all(isinstance(x, float) for x in first.logprobs)
        calls, errors = parse_tool_calls(first.text)
        assert [c.arguments for c in calls] == [{"cmd": "ls"}] and len(errors) == 1
        delta = s.append_messages([{"role": "tool", "content": "a.txt"}, {"role": "tool", "content": errors[0]}])
        second = s.generate(deadline())
        traj = s.trajectory()
        assert traj.response_ids == first.token_ids + delta + second.token_ids
        assert traj.response_logprobs[: len(first.token_ids)] == first.logprobs
        assert sum(traj.loss_mask) == len(first.token_ids) + len(second.token_ids)
        assert traj.token_exact and traj.policy_versions == ["step-3", "step-3"]
        assert traj.messages[-1] == {"role": "assistant", "content": "All done."}
        assert s.audit_drift() == {
            "retokenization_drift": 0,
            "first_diff": None,
            "drift_turns": [],
            "forged_control_tokens": 0,
        }
        assert s.budget_left == 2048 - len(traj.prompt_ids) - len(traj.response_ids)


def test_length_stop_and_context_exhaustion(simulators) -> None:
    url, _ = simulators({"default": ["a long answer that will not fit in the budget"]})
    s = LLMSession.open(spec_for(url, max_model_len=60), {"max_tokens": 3}, "r2")
    prompt = [{"role": "user", "content": "hi"}]
    s.start(prompt)
    generation = s.generate(deadline())
    assert generation.finish_reason == "turn_length" and len(generation.token_ids) == 3
    assert 2 not in generation.token_ids
    delta = s.append_messages([{"role": "user", "content": "more"}])
    assert delta[0] == 2  # the delta closes the unfinished turn itself
    while s.budget_left > 0:
        s.generate(deadline())
        s.append_messages([{"role": "user", "content": "more"}])
    last = s.generate(deadline())
    assert last.token_ids == [] and last.finish_reason == "context"
    assert s.trajectory().finish_reason == "context"
    assert len(s.trajectory().prompt_ids) + len(s.trajectory().response_ids) <= 60
    s.close()


def test_deadline_is_honoured(simulators) -> None:
    url, _ = simulators({"default": [{"text": "slow", "latency": 2.0}]})
    s = LLMSession.open(spec_for(url), {}, "r3")
    s.start([{"role": "user", "content": "hi"}])
    started = time.monotonic()
    with pytest.raises(StageTimeout):
        s.generate(time.monotonic() + 0.5)
    assert time.monotonic() - started < 1.8
    s.close()


def test_openai_chat_is_marked_not_token_exact(simulators, caplog) -> None:
    url, _ = simulators({"default": ["chat answer"]})
    s = LLMSession.open(spec_for(url, backend="openai-chat"), {}, "r4")
    assert "NOT token-exact" in caplog.text
    s.start([{"role": "user", "content": "hi"}])
    assert s.generate(deadline()).text == "chat answer"
    assert s.trajectory().token_exact is False
    s.close()


def test_qwen_style_template_through_the_session(simulators) -> None:
    url, _ = simulators(SCRIPT)
    s = LLMSession.open(spec_for(url, chat_template_text=Path(QWEN_TEMPLATE).read_text()), {"max_tokens": 200}, "r5")
    s.start(PROMPT, TOOLS)
    assert "<tools>" in s.builder.tok.hf.decode(s.trajectory().prompt_ids)
    s.generate(deadline())
    s.append_messages([{"role": "tool", "content": "a.txt"}])
    s.generate(deadline())
    assert s.audit_drift()["retokenization_drift"] == 0
    s.close()


def test_validate_spec_resolves_tokenizer_from_server_models(simulators, db_url) -> None:
    url, _ = simulators({"default": ["x"]})  # reports the tokenizer folder as its model
    spec = validate_llm_spec({"servers": [{"url": url}]})
    assert spec["tokenizer"].endswith("smollm2-tokenizer") and spec["backend"] == "vllm"
    with session_scope(db_url) as db:
        db.add(LLMServer(url=url, model=SMOLLM2))
    registered = partial(registered_urls, db_url)
    assert validate_llm_spec({"max_model_len": 1024}, registered)["tokenizer"] == SMOLLM2


def test_validate_spec_errors_name_the_field(simulators, tmp_path) -> None:
    url, _ = simulators({"model": "not-a-local-path", "default": ["x"]})
    with pytest.raises(InvalidRequest, match="llm.tokenizer"):
        validate_llm_spec({"servers": [{"url": url}]})
    with pytest.raises(InvalidRequest, match="llm.tokenizer"):
        validate_llm_spec({"tokenizer": str(tmp_path)})
    with pytest.raises(InvalidRequest, match="llm.max_model_len"):
        validate_llm_spec({"tokenizer": SMOLLM2, "max_model_len": 0})
    with pytest.raises(InvalidRequest, match="llm.temperature"):
        validate_llm_spec({"tokenizer": SMOLLM2, "temperature": 1})
    with pytest.raises(InvalidRequest, match=r"llm.servers.0.url"):
        validate_llm_spec({"servers": [{"url": "10.0.0.1:80"}]})
    with pytest.raises(InvalidRequest, match="sampling.top_p"):
        validate_sampling({"top_p": 2})
    assert SamplingParams().max_tokens == validate_sampling(None)["max_tokens"]


def test_cancel_aborts_a_generation_in_flight(simulators) -> None:
    """A cancel mid-generation closes the request: the server stops "decoding" (it counts the
    abort) and the session raises RolloutCancelled at once instead of waiting for the turn."""
    import httpx

    from core.errors import RolloutCancelled

    url, _ = simulators({"default": [{"text": "slow answer", "latency": 30}]})
    flip_at = time.monotonic() + 0.5
    with LLMSession.open(spec_for(url), {"max_tokens": 50}, "r-abort") as s:
        s.start(PROMPT)
        started = time.monotonic()
        with pytest.raises(RolloutCancelled):
            s.generate(deadline(60), cancelled=lambda: time.monotonic() >= flip_at)
        assert time.monotonic() - started < 3  # not the 30 s the turn would take
    stats = {}
    for _ in range(40):  # the simulator notices the closed connection within ~50 ms
        stats = httpx.get(f"{url}/sim/stats").json()
        if stats.get("aborted"):
            break
        time.sleep(0.05)
    assert stats.get("aborted") == 1 and not stats.get("requests")
