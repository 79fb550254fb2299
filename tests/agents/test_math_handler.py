"""The `math` handler through the real loop, a real bwrap sandbox with sympy, and the simulator.

The sandbox's Python comes from a named environment built the way production builds it
(`sandbox.environments.build_environment`, i.e. `raas env build math --package sympy
--package numpy`; the shared `built_env` fixture, a no-op once built on a machine). The LLM
simulator (a scripted fake of vLLM) plays the policy over real HTTP via `make_llm`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agents.abstract import Trajectory
from agents.job_config import JobConfig
from agents.registry import get_handler
from core.errors import InvalidRequest

REPO = Path(__file__).resolve().parents[2]
PROBLEMS = {p["instance_id"]: p for p in map(json.loads, (REPO / "examples" / "math.jsonl").read_text().splitlines())}
INTEGRAL = PROBLEMS["math-008"]  # \int_0^1 x e^x dx = 1


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def sandbox(make_sandbox, built_env) -> Any:
    """A real bwrap sandbox whose Python is the math environment (sympy + numpy)."""
    return make_sandbox(python_env=built_env("math", ["sympy", "numpy"]))


@pytest.fixture
def rollout(make_llm, make_ctx, sandbox):
    """Run INIT, RUN and EVAL of one math rollout as the pipeline sequences them."""

    def run_one(
        script: dict, instance: dict, *, limits: dict | None = None, **config: Any
    ) -> tuple[Trajectory, Any, list]:
        handler = get_handler("math")
        handler.validate_instance(instance)
        cfg = handler.Config.model_validate(config)
        limits = {"max_turns": 6, **(limits or {})}
        handler.init(make_ctx(stage="init", instance=instance, agent_config=cfg, sandbox=sandbox))
        run_ctx = make_ctx(
            instance=instance,
            agent_config=cfg,
            limits=limits,
            sandbox=sandbox,
            llm=make_llm(script, sampling={"max_tokens": 256}),
        )
        run = handler.run(run_ctx)
        eval_ctx = make_ctx(stage="eval", instance=instance, agent_config=cfg, run_result=run)
        return run, handler.evaluate(eval_ctx), run_ctx.turns_recorded

    return run_one


CODE = "import sympy as sp\nx = sp.Symbol('x')\nprint(sp.integrate(x*sp.exp(x), (x, 0, 1)))"


def test_python_then_finish_is_reward_one(rollout) -> None:
    script = {"default": [call("python", code=CODE), call("finish", answer="1")]}
    run, result, turns = rollout(script, INTEGRAL)
    assert (run.outcome, run.finish_reason, run.extra["answer"]) == ("completed", "finish", "1")
    assert turns[0]["observation"].strip() == "1"  # sympy ran inside the sandbox
    assert result.reward == 1.0 and result.metrics["graded_by"] == "exact"  # an integer reference
    assert sum(run.loss_mask) == sum(len(t["generated_ids"]) for t in turns)


def test_boxed_final_message_is_accepted(rollout) -> None:
    problem = PROBLEMS["math-009"]  # 7/2
    script = {"default": ["By Vieta the sum is 7/2, so \\boxed{\\frac{7}{2}}."]}
    run, result, _ = rollout(script, problem)
    assert (run.finish_reason, run.extra["answer"]) == ("finish", "\\frac{7}{2}")
    assert result.reward == 1.0


def test_python_syntax_answer_uses_sympy_fallback(rollout) -> None:
    problem = PROBLEMS["math-041"]  # 3x^2 + 2
    _, result, _ = rollout({"default": [call("finish", answer="3*x**2 + 2")]}, problem)
    assert (result.reward, result.metrics["graded_by"]) == (1.0, "sympy")


def test_numeric_json_answer_is_accepted(rollout) -> None:
    run, result, _ = rollout({"default": [call("finish", answer=1)]}, INTEGRAL)
    assert (run.finish_reason, run.extra["answer"], result.reward) == ("finish", 1, 1.0)


def test_wrong_answer_is_reward_zero(rollout) -> None:
    script = {"default": [call("python", code="print(1+1)"), call("finish", answer="2")]}
    run, result, _ = rollout(script, INTEGRAL)
    assert run.outcome == "completed" and result.reward == 0.0
    assert result.extra == {"predicted_answer": "2", "reference_answer": "1"}


def test_hung_code_hits_the_tool_timeout_and_the_session_goes_on(rollout) -> None:
    script = {
        "default": [
            call("python", code="while True:\n    pass"),
            call("python", code="print(6*7)"),
            call("finish", answer="1"),
        ]
    }
    started = time.monotonic()
    run, result, turns = rollout(script, INTEGRAL, limits={"tool_timeout": 2})
    assert "timed out" in turns[0]["observation"]
    assert turns[1]["observation"].strip() == "42"
    assert result.reward == 1.0 and time.monotonic() - started < 30


def test_malformed_calls_end_as_agent_error(rollout) -> None:
    script = {
        "default": [
            '<tool_call>{"name": "python"</tool_call>',
            call("python", source="1"),
            call("calculator", expr="1"),
        ]
    }
    run, result, turns = rollout(script, INTEGRAL)
    assert (run.outcome, run.finish_reason, len(turns)) == ("agent_error", "no_valid_action", 3)
    assert "unknown tool" in turns[2]["observation"]
    assert result.reward == 0.0 and result.metrics["graded_by"] == "no_answer"


def test_boxed_answers_can_be_turned_off(rollout) -> None:
    run, result, _ = rollout({"default": ["\\boxed{1}"]}, INTEGRAL, accept_boxed=False, limits={"max_turns": 2})
    assert run.finish_reason == "max_turns" and result.reward == 0.0


@pytest.mark.parametrize(
    "instance, field",
    [
        ({"answer": "1"}, "instance.problem"),
        ({"problem": "", "answer": "1"}, "instance.problem"),
        ({"problem": "p"}, "instance.answer"),
        ({"problem": "p", "answer": True}, "instance.answer"),
        ({"problem": "p", "answer": "  "}, "instance.answer"),
        ({"problem": "p", "answer": "1" * 2000}, "instance.answer"),
    ],
)
def test_validate_instance_names_the_field(instance: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        get_handler("math").validate_instance(instance)
    assert err.value.details["field"] == field


def test_every_shipped_problem_is_a_valid_instance() -> None:
    handler = get_handler("math")
    assert len(PROBLEMS) == 42  # the whole of examples/math.jsonl was read
    for problem in [*PROBLEMS.values(), {"problem": "p", "answer": 12}]:
        assert handler.validate_instance(problem) is None
        # The same instance without its answer is refused: the check really ran on it.
        with pytest.raises(InvalidRequest, match="answer"):
            handler.validate_instance({k: v for k, v in problem.items() if k != "answer"})


@pytest.mark.parametrize(
    "config",
    [
        {"tools": ["str_replace_editor"]},
        {"user_template": "no slot"},
        {"user_prompt": "no slot"},
        {"max_turns": 0},
        {"grading_timeout_s": 0},
        {"temperature": 1.0},
        {"python_env": str(Path.home() / ".pyenv")},  # a host path, never a name
    ],
)
def test_bad_config_is_rejected(config: dict) -> None:
    with pytest.raises(ValidationError):
        get_handler("math").Config.model_validate(config)


def test_sandbox_overrides_choose_the_math_env_unless_the_job_did(make_ctx) -> None:
    handler = get_handler("math")
    ctx = make_ctx(stage="init", instance=INTEGRAL, agent_config=handler.Config())
    assert handler.sandbox_overrides(ctx) == {"python_env": "math"}
    ctx = make_ctx(
        stage="init",
        instance=INTEGRAL,
        agent_config=handler.Config(),
        job_config=JobConfig(sandbox={"python_env": "/opt/envs/custom"}),
    )
    assert handler.sandbox_overrides(ctx) == {}
    no_env = handler.Config(python_env=None)
    assert handler.sandbox_overrides(make_ctx(stage="init", agent_config=no_env)) == {}
