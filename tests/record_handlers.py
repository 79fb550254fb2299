"""Test-only handler for the record-path test (loaded by workers through RAAS_HANDLER_MODULES).

`test-record-path` runs the real agent loop on the LLM simulator and writes down, at each
boundary the rollout's record crosses inside the worker processes, which class carried it and
a digest of its token arrays: the LLM session's trajectory, what RUN returned, what EVAL (and
re-evaluation) read back from the database. `tests/test_record_path.py` reads them from the
gateway and compares them with what the SDK parsed.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from agents.abstract import AgentHandler, EvalResult, HandlerConfig, Trajectory
from agents.contexts import EvalContext, InitContext, RunContext
from agents.loop import run_agent_loop
from agents.registry import register

ARRAYS = ("prompt_ids", "response_ids", "response_logprobs", "loss_mask", "policy_versions")
BOXED = re.compile(r"\\boxed\{([^}]*)\}")


def class_name(obj: Any) -> str:
    """`module.Class` of an object (compared across processes)."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def arrays_digest(record: Any) -> str:
    """A digest of a record's token arrays (identical arrays, identical digest)."""
    data = {name: getattr(record, name) for name in ARRAYS}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@register
class RecordPathHandler(AgentHandler):
    """Answer in \\boxed{}; reward 1.0 for 4. Notes the record's class at every boundary."""

    name = "test-record-path"
    Config = HandlerConfig
    needs_sandbox = False

    def init(self, ctx: InitContext) -> None:
        ctx.state["init_context"] = class_name(ctx)

    def run(self, ctx: RunContext) -> Trajectory:
        result = run_agent_loop(
            ctx,
            system_prompt="Answer in \\boxed{}.",
            user_prompt=f"Task {ctx.instance_id}: what is 2 + 2?",
            tools=[],
            max_turns=2,
            final_answer=lambda text: (BOXED.findall(text) or [None])[-1],
        )
        result.extra["boundaries"] = {
            "llm_session": class_name(ctx.llm.trajectory()),
            "llm_session_digest": arrays_digest(ctx.llm.trajectory()),
            "run_context": class_name(ctx),
            "run_returns": class_name(result),
            "run_digest": arrays_digest(result),
        }
        return result

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        answer = (ctx.artifact or {}).get("answer")
        return EvalResult(
            reward=float(str(answer).strip() == "4"),
            extra={
                "eval_context": class_name(ctx),
                "eval_reads": class_name(ctx.run_result),
                "eval_digest": arrays_digest(ctx.run_result),
                "eval_outcome": ctx.run_result.outcome,
            },
        )
