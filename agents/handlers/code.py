"""`code`: write a solution file; reward from hidden tests that enter the sandbox only in EVAL.

The hidden tests live in the instance (the database) and nowhere the sandbox can see during
RUN: the agent cannot read what it is graded on. EVAL starts a fresh shell, then writes each
test to a randomly named file, runs it in its own process with a timeout, and deletes it. A
test passes when its process exits 0 *and* prints the per-test nonce the harness adds after the
test code, so a solution that exits early (`sys.exit(0)` at import) does not pass. Reward is
the fraction passed or all-or-nothing (config).
"""
from __future__ import annotations

import json
import secrets
import shlex
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import Field

from agents.base import AgentHandler, EvalResult, HandlerConfig, RunResult, StageContext
from agents.loop import run_agent_loop
from agents.registry import register
from agents.tools import builtin_tools, finish_tool
from core.errors import InvalidRequest

SYSTEM_PROMPT = """You are an expert Python programmer working in a sandbox. Write the requested
code into the solution file with the file editor, test it by running it, and call `submit` when
you are confident it is correct. Hidden tests will import your solution file and check it."""

USER_PROMPT = """{problem_statement}

Write your solution in `{solution_file}` in {workspace} (your current directory)."""

_HARNESS = """import sys
sys.dont_write_bytecode = True
sys.path.insert(0, {workspace!r})
from {module} import *
{code}
print({marker!r})
"""


class CodeConfig(HandlerConfig):
    """Agent config of `code` jobs (prompts, tools, limits, reward)."""

    system_prompt: str = Field(SYSTEM_PROMPT, description="System message")
    user_prompt: str = Field(USER_PROMPT, description="User message; {problem_statement}, "
                                                      "{solution_file}, {workspace} filled in")
    tools: list[Literal["bash", "str_replace_editor", "python"]] = Field(
        default_factory=lambda: ["str_replace_editor", "bash"],
        description="Built-in tools besides `submit`")
    max_turns: int | None = Field(None, ge=1, description="Overrides limits.max_turns")
    max_invalid_turns: int = Field(3, ge=1, description="Turns with no valid action -> agent_error")
    reward: Literal["fraction", "all_or_nothing"] = Field(
        "fraction", description="Fraction of hidden tests passed, or 1 only if all pass")
    test_timeout: float = Field(10.0, gt=0, description="Wall seconds per hidden test")
    python_env: str | None = Field(None, description="Sandbox Python environment "
                                                     "(None: the system python3 / the job's)")


def hidden_tests(instance: dict[str, Any]) -> list[dict[str, str]]:
    """The instance's hidden tests as [{name, code}] (plain strings get numbered names)."""
    tests = []
    for i, test in enumerate(instance.get("hidden_tests") or [], start=1):
        if isinstance(test, str):
            test = {"name": f"test_{i}", "code": test}
        tests.append({"name": str(test.get("name") or f"test_{i}"), "code": str(test["code"])})
    return tests


def solution_file(instance: dict[str, Any]) -> str:
    """The relative .py path the agent must write (default `solution.py`)."""
    return str(instance.get("solution_file") or "solution.py")


def validate_code_instance(instance: dict[str, Any]) -> None:
    """Reject an instance without a statement, hidden tests, or with a bad solution path."""
    statement = instance.get("problem_statement")
    if not isinstance(statement, str) or not statement.strip():
        raise InvalidRequest("code instance is missing required field 'problem_statement'",
                             field="instance.problem_statement")
    tests = instance.get("hidden_tests")
    if not isinstance(tests, list) or not tests:
        raise InvalidRequest("code instance needs a non-empty list 'hidden_tests'",
                             field="instance.hidden_tests")
    for test in tests:
        if not (isinstance(test, str) or (isinstance(test, dict)
                                          and isinstance(test.get("code"), str))):
            raise InvalidRequest("each hidden test is a string or {name, code}",
                                 field="instance.hidden_tests")
    path = PurePosixPath(solution_file(instance))
    if path.is_absolute() or ".." in path.parts or path.suffix != ".py" \
            or not all(part.isidentifier() for part in path.with_suffix("").parts):
        raise InvalidRequest("solution_file must be a relative path to an importable .py file",
                             field="instance.solution_file")


@register
class CodeHandler(AgentHandler):
    """Programming problems graded by hidden tests run in the sandbox after RUN."""

    name = "code"
    Config = CodeConfig

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Reject an instance without a statement, hidden tests, or with a bad solution path."""
        validate_code_instance(instance)

    def init(self, ctx: StageContext) -> None:
        """Nothing goes into the workspace: the tests stay out of the sandbox until EVAL."""
        if not ctx.workspace:
            raise InvalidRequest("the code agent needs a sandbox", field="sandbox.runtime")
        ctx.state.update(workspace=ctx.workspace, solution_file=solution_file(ctx.instance))

    def run(self, ctx: StageContext) -> RunResult:
        """The shared loop with the editor, bash and `submit`."""
        cfg: CodeConfig = ctx.agent_config  # type: ignore[assignment]
        user = cfg.user_prompt.format(problem_statement=ctx.instance["problem_statement"],
                                      solution_file=solution_file(ctx.instance),
                                      workspace=ctx.workspace)
        submit = finish_tool("submit", "Submit your solution file and end the task.",
                             answer_param=None)
        return run_agent_loop(ctx, system_prompt=cfg.system_prompt, user_prompt=user,
                              tools=[*builtin_tools(cfg.tools), submit],
                              max_turns=cfg.max_turns, max_invalid_turns=cfg.max_invalid_turns)

    def evaluate(self, ctx: StageContext) -> EvalResult:
        """Run every hidden test in its own process; reward per the config."""
        cfg: CodeConfig = ctx.agent_config  # type: ignore[assignment]
        workspace = ctx.state.get("workspace") or ctx.workspace
        return grade_solution(ctx.sandbox, workspace, ctx.instance, cfg, ctx.remaining)


def grade_solution(sb: Any, workspace: str, instance: dict[str, Any], cfg: CodeConfig,
                   remaining: Any = None) -> EvalResult:
    """Copy in, run and delete the hidden tests one by one; the solution is never rewritten."""
    sb.reset()  # a fresh shell: nothing the agent left running or exported affects grading
    module = solution_file(instance)[:-3].replace("/", ".")
    results: dict[str, str] = {}
    for test in hidden_tests(instance):
        budget = cfg.test_timeout if remaining is None else min(cfg.test_timeout, remaining())
        if budget <= 0:
            results[test["name"]] = "not_run"
            continue
        results[test["name"]] = _run_one(sb, workspace, module, test["code"], budget)
    passed = sum(status == "passed" for status in results.values())
    fraction = passed / len(results) if results else 0.0
    reward = fraction if cfg.reward == "fraction" else float(passed == len(results))
    metrics = {"tests_passed": passed, "tests_total": len(results),
               "tests_timed_out": sum(s == "timeout" for s in results.values())}
    return EvalResult(reward, metrics, {"test_results": results})


def _run_one(sb: Any, workspace: str, module: str, code: str, timeout: float) -> str:
    """passed / failed / timeout for one hidden test, in a fresh interpreter."""
    nonce = secrets.token_hex(8)
    marker = f"RAAS-TEST-PASSED-{nonce}"
    path = f"{workspace}/.raas_test_{nonce}.py"
    sb.write_file(path, _HARNESS.format(workspace=workspace, module=module, code=code,
                                        marker=marker))
    try:
        result = sb.bash(f"cd {shlex.quote(workspace)} && python3 {shlex.quote(path)}",
                         timeout=timeout)
    finally:
        sb.bash(f"rm -f {shlex.quote(path)}", timeout=10)
    if result.timed_out:
        return "timeout"
    lines = result.output.strip().splitlines()
    return "passed" if result.exit_code == 0 and lines and lines[-1].strip() == marker \
        else "failed"


def load_instances(path: str) -> list[dict[str, Any]]:
    """Instances of a code JSONL file (e.g. examples/code.jsonl)."""
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]
