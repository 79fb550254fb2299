"""`code`: write a solution file; reward from hidden tests that enter a fresh sandbox in EVAL.

The hidden tests live in the instance (the database) and nowhere the agent's sandbox can see
during RUN. When RUN ends the pipeline kills that sandbox and stores the solution file (read
from the host, links never followed) as the rollout's artifact. EVAL starts a fresh sandbox
holding only that file and runs each test in its own process (`code_grading`): input/output
tests compare the solution's stdout on the host, call tests compare values the harness sends
back; nothing the solution prints counts as a pass. Reward is the fraction passed or
all-or-nothing (config).
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import Field

from agents.abstract import AgentHandler, EvalResult, SandboxToolsConfig, Trajectory
from agents.contexts import EvalContext, InitContext, RunContext
from agents.handlers.code.grading import normalize_tests, run_test
from agents.loop import run_configured_loop
from agents.registry import register
from agents.tools import builtin_tools, finish_tool
from core.errors import InvalidRequest

SYSTEM_PROMPT = """You are an expert Python programmer working in a sandbox. Write the requested
code into the solution file with the file editor, test it by running it, and call `submit` when
you are confident it is correct. Hidden tests will run or import your solution file and check
its results."""

USER_PROMPT = """{problem_statement}

Write your solution in `{solution_file}` in {workspace} (your current directory)."""

MAX_SOLUTION_BYTES = 1024 * 1024


class CodeConfig(SandboxToolsConfig):
    """Agent config of `code` jobs (prompts, tools, limits, reward)."""

    system_prompt: str = Field(SYSTEM_PROMPT, description="System message")
    user_prompt: str = Field(
        USER_PROMPT, description="User message; {problem_statement}, {solution_file}, {workspace} filled in"
    )
    tools: list[Literal["bash", "str_replace_editor", "python"]] = Field(
        default_factory=lambda: ["str_replace_editor", "bash"], description="Built-in tools besides `submit`"
    )
    reward: Literal["fraction", "all_or_nothing"] = Field(
        "fraction", description="Fraction of hidden tests passed, or 1 only if all pass"
    )
    test_timeout: float = Field(10.0, gt=0, description="Wall seconds per hidden test")
    python_env: str | None = Field(
        None, description="Sandbox Python environment (None: the system python3 / the job's)"
    )


def hidden_tests(instance: dict[str, Any]) -> list[dict[str, Any]]:
    """The instance's hidden tests, typed (see `code_grading.normalize_tests`)."""
    return normalize_tests(instance.get("hidden_tests"))


def solution_file(instance: dict[str, Any]) -> str:
    """The relative .py path the agent must write (default `solution.py`)."""
    return str(instance.get("solution_file") or "solution.py")


def validate_code_instance(instance: dict[str, Any]) -> None:
    """Reject an instance without a statement, hidden tests, or with a bad solution path."""
    statement = instance.get("problem_statement")
    if not isinstance(statement, str) or not statement.strip():
        raise InvalidRequest(
            "code instance is missing required field 'problem_statement'", field="instance.problem_statement"
        )
    hidden_tests(instance)
    path = PurePosixPath(solution_file(instance))
    if (
        path.is_absolute()
        or ".." in path.parts
        or path.suffix != ".py"
        or not all(part.isidentifier() for part in path.with_suffix("").parts)
    ):
        raise InvalidRequest(
            "solution_file must be a relative path to an importable .py file", field="instance.solution_file"
        )


@register
class CodeHandler(AgentHandler):
    """Programming problems graded by hidden tests run in the sandbox after RUN."""

    name = "code"
    resumable = True  # run() is the shared loop
    Config = CodeConfig

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Reject an instance without a statement, hidden tests, or with a bad solution path."""
        validate_code_instance(instance)

    def init(self, ctx: InitContext) -> None:
        """Nothing goes into the workspace: the tests stay out of the sandbox until EVAL."""
        if not ctx.workspace:
            raise InvalidRequest("the code agent needs a sandbox", field="sandbox.runtime")
        ctx.state.update(workspace=ctx.workspace, solution_file=solution_file(ctx.instance))

    def run(self, ctx: RunContext) -> Trajectory:
        """The shared loop with the editor, bash and `submit`."""
        cfg: CodeConfig = ctx.agent_config  # type: ignore[assignment]
        user = cfg.user_prompt.format(
            problem_statement=ctx.instance["problem_statement"],
            solution_file=solution_file(ctx.instance),
            workspace=ctx.workspace,
        )
        submit = finish_tool("submit", "Submit your solution file and end the task.", answer_param=None)
        return run_configured_loop(ctx, cfg, user_prompt=user, tools=[*builtin_tools(cfg.tools), submit])

    eval_in_sandbox = True

    def artifact(self, ctx: RunContext, result: Trajectory) -> dict[str, Any]:
        """The solution file as the agent left it (absent, not a regular file or too big: none)."""
        from sandbox.workspace import read_regular

        name = solution_file(ctx.instance)
        data = read_regular(ctx.workspace, name, MAX_SOLUTION_BYTES) if ctx.workspace else None
        if data is None:
            return {"files": {}}
        return {"files": {name: data.decode("utf-8", errors="replace")}}

    def prepare_eval(self, ctx: EvalContext, workspace: str) -> dict[str, Any] | None:
        """The fresh workspace holds the stored solution file and nothing else (kept in extra)."""
        from pathlib import Path

        name = solution_file(ctx.instance)
        text = ((ctx.artifact or {}).get("files") or {}).get(name)
        if not isinstance(text, str):
            return {"files": {}}
        target = Path(workspace, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return {"files": {name: text}}  # what was graded, for people reading the result

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        """Run every hidden test in its own process; reward per the config."""
        cfg: CodeConfig = ctx.agent_config  # type: ignore[assignment]
        workspace = ctx.workspace or ctx.state.get("workspace")
        return grade_solution(ctx.sandbox, workspace, ctx.instance, cfg, ctx.remaining)


def grade_solution(
    sb: Any, workspace: str, instance: dict[str, Any], cfg: CodeConfig, remaining: Any = None
) -> EvalResult:
    """Run the hidden tests one by one in the grading sandbox; compare on the host."""
    name = solution_file(instance)
    module = name[:-3].replace("/", ".")
    results: dict[str, str] = {}
    for test in hidden_tests(instance):
        budget = cfg.test_timeout if remaining is None else min(cfg.test_timeout, remaining())
        if budget <= 0:
            results[test["name"]] = "not_run"
            continue
        results[test["name"]] = run_test(sb, workspace, module, name, test, budget)
    passed = sum(status == "passed" for status in results.values())
    fraction = passed / len(results) if results else 0.0
    reward = fraction if cfg.reward == "fraction" else float(passed == len(results))
    metrics = {
        "tests_passed": passed,
        "tests_total": len(results),
        "tests_timed_out": sum(s == "timeout" for s in results.values()),
    }
    return EvalResult(reward, metrics, {"test_results": results})


def load_instances(path: str) -> list[dict[str, Any]]:
    """Instances of a code JSONL file (e.g. examples/code.jsonl)."""
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]
