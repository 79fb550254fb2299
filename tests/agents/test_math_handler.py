"""The `math` handler through the real loop, a real bwrap sandbox with sympy, and the simulator.

The sandbox's Python comes from a named environment built like production builds it
(`sandbox.environments.build_environment`, i.e. `raas env build math --package sympy
--package numpy`), cached across runs under $RAAS_TEST_ENVS (default /tmp/raas-test-envs).
"""
from __future__ import annotations

import json
import os
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
from sandbox import SandboxSpec, get_runtime, stop_handle
from sandbox.environments import build_environment

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
PROBLEMS = {p["instance_id"]: p for p in map(json.loads, (REPO / "examples" / "math.jsonl")
                                                .read_text().splitlines())}
INTEGRAL = PROBLEMS["math-008"]  # \int_0^1 x e^x dx = 1
ENVS = Path(os.environ.get("RAAS_TEST_ENVS", "/tmp/raas-test-envs"))


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture(scope="session")
def math_env() -> str:
    """Absolute path of a `math` environment (system Python venv with sympy + numpy)."""
    return str(build_environment("math", ["sympy", "numpy"], root=ENVS))


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    upgrade(sqlite_url)
    return sqlite_url


@pytest.fixture
def sandbox(tmp_path, math_env) -> Iterator[Any]:
    """A real bwrap sandbox whose Python is the math environment."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    sb = get_runtime("bwrap").start(SandboxSpec(workspace=str(workspace), python_env=math_env),
                                    label="math-test:1")
    yield sb
    stop_handle(sb.handle)


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


def make_ctx(instance: dict, stage: str, *, agent_config: dict | None = None, limits: dict | None = None,
             sandbox: Any = None, llm: Any = None, turns: list | None = None) -> StageContext:
    return StageContext(
        rollout_id="r-math", job_id="j-math", stage=stage, instance_id="i", instance=instance,
        sample_index=0, attempt=1,
        agent_config=get_handler("math").Config.model_validate(agent_config or {}),
        job_config={"limits": {"max_turns": 6, **(limits or {})}}, deadline=time.monotonic() + 60,
        state={}, sandbox=sandbox, llm=llm,
        record_turn=(lambda **t: turns.append(t)) if turns is not None else (lambda **t: None))


def rollout(db_url: str, url: str, sandbox: Any, instance: dict, *, limits: dict | None = None,
            **config: Any) -> tuple[RunResult, Any, list]:
    """INIT, RUN and EVAL of one rollout as the pipeline sequences them."""
    handler = get_handler("math")
    handler.validate_instance(instance)
    turns: list = []
    handler.init(make_ctx(instance, "init", agent_config=config, sandbox=sandbox))
    spec = {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
    with LLMSession.open(spec, {"max_tokens": 256}, "r-math", db_url) as llm:
        run = handler.run(make_ctx(instance, "run", agent_config=config, limits=limits,
                                   sandbox=sandbox, llm=llm, turns=turns))
    eval_ctx = make_ctx(instance, "eval", agent_config=config)
    eval_ctx.run_result = run
    return run, handler.evaluate(eval_ctx), turns


CODE = "import sympy as sp\nx = sp.Symbol('x')\nprint(sp.integrate(x*sp.exp(x), (x, 0, 1)))"


def test_python_then_finish_is_reward_one(db_url, simulator, sandbox) -> None:
    url = simulator({"default": [call("python", code=CODE), call("finish", answer="1")]})
    run, result, turns = rollout(db_url, url, sandbox, INTEGRAL)
    assert (run.outcome, run.finish_reason, run.extra["answer"]) == ("completed", "finish", "1")
    assert turns[0]["observation"].strip() == "1"  # sympy ran inside the sandbox
    assert result.reward == 1.0 and result.metrics["graded_by"] == "math_verify"
    assert sum(run.loss_mask) == sum(len(t["generated_ids"]) for t in turns)


def test_boxed_final_message_is_accepted(db_url, simulator, sandbox) -> None:
    problem = PROBLEMS["math-009"]  # 7/2
    url = simulator({"default": ["By Vieta the sum is 7/2, so \\boxed{\\frac{7}{2}}."]})
    run, result, _ = rollout(db_url, url, sandbox, problem)
    assert (run.finish_reason, run.extra["answer"]) == ("finish", "\\frac{7}{2}")
    assert result.reward == 1.0


def test_python_syntax_answer_uses_sympy_fallback(db_url, simulator, sandbox) -> None:
    problem = PROBLEMS["math-041"]  # 3x^2 + 2
    url = simulator({"default": [call("finish", answer="3*x**2 + 2")]})
    _, result, _ = rollout(db_url, url, sandbox, problem)
    assert (result.reward, result.metrics["graded_by"]) == (1.0, "sympy")


def test_wrong_answer_is_reward_zero(db_url, simulator, sandbox) -> None:
    url = simulator({"default": [call("python", code="print(1+1)"), call("finish", answer="2")]})
    run, result, _ = rollout(db_url, url, sandbox, INTEGRAL)
    assert run.outcome == "completed" and result.reward == 0.0
    assert result.extra == {"predicted_answer": "2", "reference_answer": "1"}


def test_hung_code_hits_the_tool_timeout_and_the_session_goes_on(db_url, simulator, sandbox) -> None:
    url = simulator({"default": [call("python", code="while True:\n    pass"),
                                 call("python", code="print(6*7)"), call("finish", answer="1")]})
    started = time.monotonic()
    run, result, turns = rollout(db_url, url, sandbox, INTEGRAL, limits={"tool_timeout": 2})
    assert "timed out" in turns[0]["observation"]
    assert turns[1]["observation"].strip() == "42"
    assert result.reward == 1.0 and time.monotonic() - started < 30


def test_malformed_calls_end_as_agent_error(db_url, simulator, sandbox) -> None:
    url = simulator({"default": ['<tool_call>{"name": "python"</tool_call>',
                                 call("python", source="1"), call("calculator", expr="1")]})
    run, result, turns = rollout(db_url, url, sandbox, INTEGRAL)
    assert (run.outcome, run.finish_reason, len(turns)) == ("agent_error", "no_valid_action", 3)
    assert "unknown tool" in turns[2]["observation"]
    assert result.reward == 0.0 and result.metrics["graded_by"] == "no_answer"


def test_boxed_answers_can_be_turned_off(db_url, simulator, sandbox) -> None:
    url = simulator({"default": ["\\boxed{1}"]})
    run, result, _ = rollout(db_url, url, sandbox, INTEGRAL, accept_boxed=False,
                             limits={"max_turns": 2})
    assert run.finish_reason == "max_turns" and result.reward == 0.0


@pytest.mark.parametrize("instance, field", [
    ({"answer": "1"}, "instance.problem"),
    ({"problem": "", "answer": "1"}, "instance.problem"),
    ({"problem": "p"}, "instance.answer"),
    ({"problem": "p", "answer": True}, "instance.answer"),
    ({"problem": "p", "answer": "  "}, "instance.answer"),
    ({"problem": "p", "answer": "1" * 2000}, "instance.answer"),
])
def test_validate_instance_names_the_field(instance: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        get_handler("math").validate_instance(instance)
    assert err.value.details["field"] == field


def test_every_shipped_problem_is_a_valid_instance() -> None:
    for problem in PROBLEMS.values():
        get_handler("math").validate_instance(problem)
    get_handler("math").validate_instance({"problem": "p", "answer": 12})


@pytest.mark.parametrize("config", [
    {"tools": ["str_replace_editor"]}, {"user_template": "no slot"}, {"max_turns": 0},
    {"grading_timeout_s": 0}, {"temperature": 1.0},
])
def test_bad_config_is_rejected(config: dict) -> None:
    with pytest.raises(ValidationError):
        get_handler("math").Config.model_validate(config)


def test_sandbox_overrides_choose_the_math_env_unless_the_job_did() -> None:
    handler = get_handler("math")
    ctx = make_ctx(INTEGRAL, "init")
    assert handler.sandbox_overrides(ctx) == {"python_env": "math"}
    ctx.job_config["sandbox"] = {"python_env": "/opt/envs/custom"}
    assert handler.sandbox_overrides(ctx) == {}
    assert handler.sandbox_overrides(make_ctx(INTEGRAL, "init", agent_config={"python_env": None})) == {}
