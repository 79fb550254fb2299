"""Test-only handler for straggler cuts (loaded by workers through RAAS_HANDLER_MODULES).

`test-straggler`: each sample's RUN sleeps `data.run_s[sample_index]` seconds in slices that
check for a cancel (a cut reaches it like a job cancel), and samples listed in `data.fail`
raise an infrastructure error in RUN (no reward: they must never fill a group); those in
`data.timeout` end RUN as `timeout` and are graded (a reward, but no policy sample either).
"""

from __future__ import annotations

import time

from agents.abstract import AgentHandler, EvalResult, HandlerConfig, Trajectory
from agents.contexts import EvalContext, InitContext, RunContext
from agents.registry import register
from core.errors import InfraError


@register
class StragglerHandler(AgentHandler):
    """Per-sample RUN time and infrastructure failures, reward 1.0 for what finishes."""

    name = "test-straggler"
    Config = HandlerConfig
    needs_sandbox = False
    needs_llm = False

    def init(self, ctx: InitContext) -> None:
        pass

    def run(self, ctx: RunContext) -> Trajectory:
        if ctx.sample_index in ctx.instance.get("fail", []):
            raise InfraError(f"injected infrastructure failure of sample {ctx.sample_index}")
        seconds = ctx.instance.get("run_s", [0.0])
        until = time.monotonic() + seconds[min(ctx.sample_index, len(seconds) - 1)]
        while time.monotonic() < until:
            ctx.checkpoint()
            time.sleep(0.05)
        ctx.record_turn(index=0, text="done", generated_ids=[7, 8], logprobs=[-0.5, -0.25])
        timed_out = ctx.sample_index in ctx.instance.get("timeout", [])  # graded, not a sample
        return Trajectory(
            outcome="timeout" if timed_out else "completed",
            finish_reason="deadline" if timed_out else "stop",
            prompt_ids=[1, 2],
            response_ids=[7, 8],
            response_logprobs=[-0.5, -0.25],
            loss_mask=[1, 1],
        )

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        return EvalResult(reward=1.0)
