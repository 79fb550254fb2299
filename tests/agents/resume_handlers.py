"""Test-only handlers for the resume tests: `math` whose first RUN fails after turn 1, and
`math` whose first EVAL fails."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from agents.abstract import EvalResult, Trajectory
from agents.contexts import EvalContext, RunContext
from agents.handlers.math.handler import MathHandler
from agents.registry import register


@register
class FlakyMathHandler(MathHandler):
    """`math`, but the first RUN raises a retryable error once turn 1 is logged."""

    name = "test-flaky-math"

    def run(self, ctx: RunContext) -> Trajectory:
        if ctx.resume_turns is None:
            record = ctx.record_turn

            def record_then_fail(**turn):
                record(**turn)
                if turn["index"] == 1:
                    raise ConnectionError("injected: the RUN worker lost a connection")

            ctx = dataclasses.replace(ctx, record_turn=record_then_fail)
        return super().run(ctx)


@register
class FlakyGraderHandler(MathHandler):
    """`math`, but the first EVAL of each rollout raises a retryable error (marker file)."""

    name = "test-flaky-grader"

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        marker = Path(tempfile.gettempdir()) / f"raas-flaky-grader-{ctx.rollout_id}"
        if not marker.exists():
            marker.touch()
            raise ConnectionError("injected: the EVAL worker lost a connection")
        marker.unlink()
        return super().evaluate(ctx)
