"""The `search` handler through the real agent loop, LLM session and LLM simulator.

No sandbox is involved (the tools are host-side); the simulator plays the policy with scripted
replies over real HTTP, so the tool calls go through the same parsing, execution and
persistence as with a real model.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agents.base import RunResult, StageContext
from agents.llm import LLMSession
from agents.llm.simulator import start_simulator
from agents.registry import get_handler
from app.errors import InvalidRequest
from migrations.runner import upgrade

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
QUESTIONS = {q["instance_id"]: q for q in map(json.loads, (REPO / "examples" / "search" /
                                                           "questions.jsonl").read_text().splitlines())}
LRU = QUESTIONS["search-003"]  # lru_cache maxsize -> 128


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    upgrade(sqlite_url)
    return sqlite_url


@pytest.fixture
def simulator() -> Iterator[Callable[[dict], str]]:
    """Start LLM simulators (fakes of a vLLM server) with a script; stopped after the test."""
    stops = []

    def start(script: dict) -> str:
        url, stop = start_simulator(SMOLLM2, script)
        stops.append(stop)
        return url

    yield start
    for stop in stops:
        stop()


def make_ctx(instance: dict, stage: str, *, agent_config: dict | None = None,
             llm: Any = None, state: dict | None = None, turns: list | None = None,
             max_turns: int = 6) -> StageContext:
    handler = get_handler("search")
    return StageContext(
        rollout_id="r-search", job_id="j-search", stage=stage, instance_id="i", instance=instance,
        sample_index=0, attempt=1, agent_config=handler.Config.model_validate(agent_config or {}),
        job_config={"limits": {"max_turns": max_turns}}, deadline=time.monotonic() + 60,
        state=state if state is not None else {}, llm=llm,
        record_turn=(lambda **t: turns.append(t)) if turns is not None else (lambda **t: None))


def rollout(db_url: str, url: str, instance: dict, **config: Any) -> tuple[RunResult, Any, list]:
    """INIT, RUN and EVAL of one rollout as the pipeline sequences them."""
    handler = get_handler("search")
    handler.validate_instance(instance)
    state: dict = {}
    turns: list = []
    handler.init(make_ctx(instance, "init", agent_config=config, state=state))
    spec = {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
    with LLMSession.open(spec, {"max_tokens": 256}, "r-search", db_url) as llm:
        run = handler.run(make_ctx(instance, "run", agent_config=config, llm=llm, state=state,
                                   turns=turns))
    eval_ctx = make_ctx(instance, "eval", agent_config=config, state=state)
    eval_ctx.run_result = run
    return run, handler.evaluate(eval_ctx), turns


def test_scripted_success_is_reward_one(db_url, simulator) -> None:
    url = simulator({"default": [call("search", query="lru_cache maxsize"),
                                 "The docs say 128. " + call("answer", text="128")]})
    run, result, turns = rollout(db_url, url, LRU)
    assert (run.outcome, run.finish_reason, run.extra["answer"]) == ("completed", "finish", "128")
    assert result.reward == 1.0
    assert result.metrics["gold_passage_retrieved"] is True
    assert result.metrics["exact_match"] == 1.0
    assert len(turns) == 2 and "functools.lru_cache" in turns[0]["observation"]
    assert run.metrics["tool_calls_by_name"] == {"search": 1, "answer": 1}
    assert sum(run.loss_mask) == sum(len(t["generated_ids"]) for t in turns)


def test_scripted_wrong_answer_is_reward_zero(db_url, simulator) -> None:
    url = simulator({"default": [call("search", query="gzip"), call("answer", text="256")]})
    run, result, _ = rollout(db_url, url, LRU)
    assert run.outcome == "completed" and result.reward == 0.0
    assert result.metrics["gold_passage_retrieved"] is False


def test_partial_answer_gets_f1_credit_or_zero_under_exact_match(db_url, simulator) -> None:
    instance = QUESTIONS["search-010"]  # gestalt pattern matching
    script = {"default": [call("answer", text="gestalt matching")]}
    _, f1, _ = rollout(db_url, simulator(script), instance)
    assert f1.reward == pytest.approx(0.8)
    _, em, _ = rollout(db_url, simulator(script), instance, reward="exact_match")
    assert em.reward == 0.0 and em.metrics["f1"] == pytest.approx(0.8)


def test_malformed_calls_end_as_agent_error(db_url, simulator) -> None:
    url = simulator({"default": ['<tool_call>{"name": "search", "arguments": {"query": </tool_call>',
                                 call("search", q="wrong argument name"), "I think it is 128."]})
    run, result, turns = rollout(db_url, url, LRU)
    assert (run.outcome, run.finish_reason) == ("agent_error", "no_valid_action")
    assert len(turns) == 3 and "malformed" in turns[0]["observation"]
    assert "invalid arguments" in turns[1]["observation"]
    assert result.reward == 0.0 and result.metrics["answered"] is False


def test_max_turns_without_answer(db_url, simulator) -> None:
    url = simulator({"default": [call("search", query="heapq")]})
    run, result, turns = rollout(db_url, url, LRU, max_turns=2)
    assert (run.outcome, run.finish_reason, len(turns)) == ("completed", "max_turns", 2)
    assert result.reward == 0.0


@pytest.mark.parametrize("instance, field", [
    ({"answers": ["x"]}, "instance.question"),
    ({"question": "  ", "answers": ["x"]}, "instance.question"),
    ({"question": "q"}, "instance.answer"),
    ({"question": "q", "answers": []}, "instance.answers"),
    ({"question": "q", "answers": ["+"]}, "instance.answers"),
    ({"question": "q", "answers": [3]}, "instance.answers"),
])
def test_validate_instance_names_the_field(instance: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        get_handler("search").validate_instance(instance)
    assert err.value.details["field"] == field


def test_every_shipped_question_is_a_valid_instance() -> None:
    for question in QUESTIONS.values():
        get_handler("search").validate_instance(question)
    get_handler("search").validate_instance({"question": "q", "answer": "single"})


@pytest.mark.parametrize("config", [
    {"top_k": 0}, {"reward": "bleu"}, {"corpus_path": "nope.jsonl"},
    {"user_template": "no slot"}, {"unknown": 1},
])
def test_bad_config_is_rejected(config: dict) -> None:
    with pytest.raises(ValidationError):
        get_handler("search").Config.model_validate(config)
