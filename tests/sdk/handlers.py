"""Test-only handler for the SDK's batch tests (registered in workers via RAAS_HANDLER_MODULES).

`test-grpo` runs a real agent loop against the LLM simulator (a fake model, named as such):
turn 0 calls `observe`, turn 1 answers `\\boxed{...}`; the reward is 1.0 when the answer is the
instance's `answer`. The simulator's `wrong_rate` makes some answers wrong (reward variance).
An instance may name samples that fail on purpose: `infra_samples` raise an infrastructure
error in INIT (outcome infra_error with `max_attempts` 1), `policy_samples` end as the policy's
failure (agent_error, no valid action) with their real trajectory.
"""

from __future__ import annotations

import re

from agents.abstract import AgentHandler, AgentLoopConfig, EvalResult, Trajectory
from agents.contexts import EvalContext, InitContext, RunContext
from agents.loop import run_agent_loop
from agents.registry import register
from agents.tools import Tool, ToolOutput
from core.errors import InfraError

BOXED = re.compile(r"\\boxed\{([^}]*)\}")


@register
class GrpoHandler(AgentHandler):
    """Observe once, answer in a box; graded against the instance's answer."""

    name = "test-grpo"
    Config = AgentLoopConfig
    needs_sandbox = False

    def init(self, ctx: InitContext) -> None:
        if ctx.sample_index in ctx.instance.get("infra_samples", []):
            raise InfraError(f"injected infrastructure failure (sample {ctx.sample_index})")

    def run(self, ctx: RunContext) -> Trajectory:
        def observe(ctx: RunContext, arguments: dict) -> ToolOutput:
            return ToolOutput(f"The task {ctx.instance_id} asks for 2 + 2.")

        tool = Tool("observe", "Read the task", {"type": "object", "properties": {}}, observe)
        result = run_agent_loop(
            ctx,
            system_prompt="Answer in \\boxed{}.",
            user_prompt=f"Task {ctx.instance_id}: observe it, then answer.",
            tools=[tool],
            max_turns=3,
            final_answer=lambda text: (BOXED.findall(text) or [None])[-1],
        )
        if ctx.sample_index in ctx.instance.get("policy_samples", []):
            result.outcome, result.finish_reason = "agent_error", "no_valid_action"
        return result

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        answer = (ctx.run_result.extra or {}).get("answer")
        if ctx.run_result.outcome == "agent_error":
            return EvalResult(reward=0.0)
        return EvalResult(reward=float(str(answer).strip() == str(ctx.instance["answer"])))
