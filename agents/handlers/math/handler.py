"""`math`: solve a problem with a persistent Python session; graded by math-verify.

The agent has two tools: `python` (the sandbox's persistent interpreter, for computing and
checking) and `finish(answer)`. A reply with no tool call but a `\\boxed{...}` also ends the
episode with that answer, since that is how math-tuned models are trained to answer. EVAL
grades host-side with math-verify and a sympy-equivalence fallback (`answer`), so it
needs nothing from the sandbox.

Packages for the agent's Python (sympy, numpy) come from a named environment, by default
`math`, built once per node with the system interpreter:

    raas env build math --package sympy --package numpy

The handler asks for it through the default `sandbox_overrides`, unless the job names its own
`sandbox.python_env`; `python_env: null` in the agent config uses the bare system Python.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field, field_validator

from agents.abstract import AgentHandler, EvalResult, HandlerConfig, SandboxToolsConfig, Trajectory
from agents.contexts import EvalContext, InitContext, RunContext
from agents.instance_fields import require_text
from agents.loop import run_configured_loop
from agents.registry import register
from agents.handlers.math.answer import answer_from_run, extract_boxed, grade_math_answer
from agents.tools import builtin_tools, finish_tool
from core.errors import InvalidRequest

MAX_ANSWER_CHARS = 1000

DEFAULT_SYSTEM_PROMPT = """\
You are a careful mathematician. Solve the problem step by step.
You may run Python with the `python` tool (a persistent session; sympy and numpy are \
installed) to compute or to check your work.
When you are sure, call the `finish` tool with only the final answer: a number or a \
simplified expression such as 3/4, 2*sqrt(3) or 5 + i, without words or units."""

DEFAULT_USER_TEMPLATE = "Problem: {problem}"


class MathConfig(SandboxToolsConfig):
    """The `math` handler's agent_config."""

    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, min_length=1, description="System message of every rollout")
    user_prompt: str = Field(DEFAULT_USER_TEMPLATE, description="User message; `{problem}` becomes the problem text")
    tools: list[Literal["python", "bash"]] = Field(
        default_factory=lambda: ["python"],
        description="Sandbox tools besides `finish` (empty: the agent can only reason)",
    )
    python_env: str | None = Field(
        "math",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Named sandbox Python environment (sympy, numpy) built on each node; null: "
        "the system interpreter only. A path is the job's `sandbox.python_env`.",
    )
    accept_boxed: bool = Field(
        True, description="A reply without tool calls ending in \\boxed{...} finishes with that answer"
    )
    grading_timeout_s: int = Field(5, ge=1, le=120, description="Seconds allowed to each grading step")
    decimal_tolerance: float = Field(
        1e-6,
        ge=0,
        le=0.1,
        description="Relative tolerance for non-integer decimal reference "
        "answers only; integer and rational references always need the exact number",
    )

    @field_validator("user_prompt")
    @classmethod
    def _has_problem_slot(cls, value: str) -> str:
        if "{problem}" not in value:
            raise ValueError("must contain the placeholder {problem}")
        return value


def _answer_artifact(cfg: MathConfig, run: Trajectory) -> dict[str, Any]:
    """The answer: the finish tool's argument, else the final message's \\boxed{}."""
    final_text = _final_assistant_text(run) if cfg.accept_boxed else None
    predicted = answer_from_run((run.extra or {}).get("answer"), final_text)
    return {} if predicted is None else {"answer": predicted}


def _final_assistant_text(run: Trajectory | None) -> str | None:
    """Content of the last assistant message of the trajectory, if any."""
    for message in reversed((run.messages or []) if run else []):
        if message.get("role") == "assistant" and isinstance(message.get("content"), str):
            return message["content"]
    return None


@register
class MathHandler(AgentHandler):
    """Math word problems with a Python tool; reward 1 iff the answer is equivalent."""

    name = "math"
    resumable = True  # run() is the shared loop
    Config = MathConfig
    environments = {"math": ("sympy", "numpy")}

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Needs `problem` (text) and `answer` (LaTeX/plain text or a number)."""
        require_text(instance, "problem")
        require_text(instance, "answer", numbers_ok=True)
        if len(str(instance["answer"])) > MAX_ANSWER_CHARS:
            raise InvalidRequest(
                f"instance.answer is longer than {MAX_ANSWER_CHARS} characters", field="instance.answer"
            )

    def sandbox_needed(self, config: HandlerConfig) -> bool:
        """Only the tools run in the sandbox: `tools: []` (reasoning alone) starts none."""
        return bool(config.tools)  # type: ignore[attr-defined]

    def init(self, ctx: InitContext) -> None:
        """Nothing to prepare: the problem is in the prompt and the tools need no files."""

    def prompt(self, instance: dict[str, Any], config: HandlerConfig) -> tuple[str, str, list[Any]]:
        """The system prompt, the problem in the user template, `python` (+ tools) and finish."""
        cfg: MathConfig = config  # type: ignore[assignment]
        finish = finish_tool(
            description="Submit your final answer and end the task.",
            answer_description="The final answer only, e.g. 3/4 or 2*sqrt(3)",
        )
        # Models often send a bare JSON number ({"answer": 12}); that is an answer, not misuse.
        finish.parameters["properties"]["answer"]["type"] = ["string", "number"]
        return (
            cfg.system_prompt,
            cfg.user_prompt.replace("{problem}", str(instance["problem"])),
            builtin_tools(list(cfg.tools)) + [finish],
        )

    def run(self, ctx: RunContext) -> Trajectory:
        """The shared loop with `python` (+ configured tools) and `finish(answer)`."""
        cfg: MathConfig = ctx.agent_config
        _, user_prompt, tools = self.prompt(ctx.instance, cfg)
        final_answer = extract_boxed if cfg.accept_boxed else None
        return run_configured_loop(ctx, cfg, user_prompt=user_prompt, tools=tools, final_answer=final_answer)

    def artifact(self, ctx: RunContext, result: Trajectory) -> dict[str, Any]:
        """The answer: the finish tool's argument, else the final message's \\boxed{}."""
        return _answer_artifact(ctx.agent_config, result)

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        """Grade the stored answer against the instance's `answer`, on the host."""
        cfg: MathConfig = ctx.agent_config
        artifact = ctx.artifact if ctx.artifact is not None else _answer_artifact(cfg, ctx.run_result)
        predicted = artifact.get("answer")
        return math_graded(
            predicted,
            str(ctx.instance["answer"]),
            answered=predicted is not None,
            timeout_s=cfg.grading_timeout_s,
            decimal_tolerance=cfg.decimal_tolerance,
        )


def math_graded(predicted: str | None, reference: str, *, answered: bool, **grading: Any) -> EvalResult:
    """The EvalResult of an answer graded by `grade_math_answer` (`grading`: its keywords),
    as every math-graded handler reports it: how it was graded, whether the agent answered
    at all, the grading time, and both answers."""
    started = time.monotonic()
    grade = grade_math_answer(predicted, reference, **grading)
    return EvalResult(
        reward=grade.reward,
        metrics={
            "graded_by": grade.method,
            "answered": answered,
            "grading_seconds": round(time.monotonic() - started, 4),
        },
        extra={"predicted_answer": predicted, "reference_answer": reference},
    )
