"""The `search` handler through the real agent loop, LLM session and LLM simulator.

No sandbox is involved (the tools are host-side); the simulator (a scripted fake of vLLM)
plays the policy over real HTTP via the shared `make_llm` fixture, so the tool calls go through
the same parsing, execution and persistence as with a real model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agents.abstract import Trajectory
from agents.registry import get_handler
from core.errors import InvalidRequest

REPO = Path(__file__).resolve().parents[2]
QUESTIONS_FILE = REPO / "examples" / "search" / "questions.jsonl"
QUESTIONS = {q["instance_id"]: q for q in map(json.loads, QUESTIONS_FILE.read_text().splitlines())}
LRU = QUESTIONS["search-003"]  # lru_cache maxsize -> 128


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def rollout(make_llm, make_ctx):
    """Run INIT, RUN and EVAL of one search rollout as the pipeline sequences them."""

    def run_one(script: dict, instance: dict, *, max_turns: int = 6, **config: Any) -> tuple[Trajectory, Any, list]:
        handler = get_handler("search")
        handler.validate_instance(instance)
        cfg = handler.Config.model_validate(config)
        state: dict = {}  # the pipeline carries it from stage to stage
        handler.init(make_ctx(stage="init", instance=instance, agent_config=cfg, state=state))
        run_ctx = make_ctx(
            instance=instance,
            agent_config=cfg,
            state=state,
            limits={"max_turns": max_turns},
            llm=make_llm(script, sampling={"max_tokens": 256}),
        )
        run = handler.run(run_ctx)
        eval_ctx = make_ctx(stage="eval", after=run_ctx, run_result=run)
        return run, handler.evaluate(eval_ctx), run_ctx.turns_recorded

    return run_one


def test_scripted_success_is_reward_one(rollout) -> None:
    script = {"default": [call("search", query="lru_cache maxsize"), "The docs say 128. " + call("answer", text="128")]}
    run, result, turns = rollout(script, LRU)
    assert (run.outcome, run.finish_reason, run.extra["answer"]) == ("completed", "finish", "128")
    assert result.reward == 1.0
    assert result.metrics["gold_passage_retrieved"] is True
    assert result.metrics["exact_match"] == 1.0
    assert len(turns) == 2 and "functools.lru_cache" in turns[0]["observation"]
    assert run.metrics["tool_calls_by_name"] == {"search": 1, "answer": 1}
    assert sum(run.loss_mask) == sum(len(t["generated_ids"]) for t in turns)


def test_scripted_wrong_answer_is_reward_zero(rollout) -> None:
    script = {"default": [call("search", query="gzip"), call("answer", text="256")]}
    run, result, _ = rollout(script, LRU)
    assert run.outcome == "completed" and result.reward == 0.0
    assert result.metrics["gold_passage_retrieved"] is False


def test_partial_answer_gets_f1_credit_or_zero_under_exact_match(rollout) -> None:
    instance = QUESTIONS["search-010"]  # gestalt pattern matching
    script = {"default": [call("answer", text="gestalt matching")]}
    _, f1, _ = rollout(script, instance)
    assert f1.reward == pytest.approx(0.8)
    _, em, _ = rollout(script, instance, reward="exact_match")
    assert em.reward == 0.0 and em.metrics["f1"] == pytest.approx(0.8)


def test_malformed_calls_end_as_agent_error(rollout) -> None:
    script = {
        "default": [
            '<tool_call>{"name": "search", "arguments": {"query": </tool_call>',
            call("search", q="wrong argument name"),
            "I think it is 128.",
        ]
    }
    run, result, turns = rollout(script, LRU)
    assert (run.outcome, run.finish_reason) == ("agent_error", "no_valid_action")
    assert len(turns) == 3 and "malformed" in turns[0]["observation"]
    assert "invalid arguments" in turns[1]["observation"]
    assert result.reward == 0.0 and result.metrics["answered"] is False


def test_max_turns_without_answer(rollout) -> None:
    run, result, turns = rollout({"default": [call("search", query="heapq")]}, LRU, max_turns=2)
    assert (run.outcome, run.finish_reason, len(turns)) == ("completed", "max_turns", 2)
    assert result.reward == 0.0


@pytest.mark.parametrize(
    "instance, field",
    [
        ({"answers": ["x"]}, "instance.question"),
        ({"question": "  ", "answers": ["x"]}, "instance.question"),
        ({"question": "q"}, "instance.answer"),
        ({"question": "q", "answers": []}, "instance.answers"),
        ({"question": "q", "answers": ["+"]}, "instance.answers"),
        ({"question": "q", "answers": [3]}, "instance.answers"),
    ],
)
def test_validate_instance_names_the_field(instance: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        get_handler("search").validate_instance(instance)
    assert err.value.details["field"] == field


def test_every_shipped_question_is_a_valid_instance() -> None:
    handler = get_handler("search")
    assert len(QUESTIONS) == 38  # the whole of examples/search/questions.jsonl was read
    for question in [*QUESTIONS.values(), {"question": "q", "answer": "single"}]:
        assert handler.validate_instance(question) is None
        # The same question without its question text is refused: the check really ran.
        with pytest.raises(InvalidRequest, match="question"):
            handler.validate_instance({k: v for k, v in question.items() if k != "question"})


@pytest.mark.parametrize(
    "config",
    [
        {"top_k": 0},
        {"reward": "bleu"},
        {"corpus_path": "examples/search/nope.jsonl"},
        {"corpus_path": "/etc/passwd"},
        {"corpus_path": "examples/../setup.cfg"},
        {"user_template": "no slot"},
        {"user_prompt": "no slot"},
        {"unknown": 1},
    ],
)
def test_bad_config_is_rejected(config: dict) -> None:
    with pytest.raises(ValidationError):
        get_handler("search").Config.model_validate(config)


def test_corpus_may_live_in_the_raas_home(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAAS_HOME", str(tmp_path))
    corpus = tmp_path / "corpora" / "mine.jsonl"
    corpus.parent.mkdir()
    corpus.write_text('{"id": "p1", "title": "t", "text": "hello"}\n')
    assert get_handler("search").Config(corpus_path=str(corpus)).corpus_path == str(corpus)
