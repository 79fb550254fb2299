"""Test-only agent handlers for pipeline tests (registered in workers via RAAS_HANDLER_MODULES).

They need no sandbox and no LLM, so pipeline tests exercise exactly the pipeline: claims,
routing, heartbeats, deadlines, cancel, retries, persistence.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import Field

from agents.abstract import AgentHandler, AgentLoopConfig, EvalResult, HandlerConfig, Trajectory
from agents.contexts import EvalContext, InitContext, RunContext
from agents.loop import run_agent_loop
from agents.registry import register
from agents.tools import Tool, ToolOutput
from core.errors import InfraError


class SleepyConfig(HandlerConfig):
    """Seconds each stage sleeps and how many turns RUN records."""

    init_s: float = Field(0.0, ge=0)
    run_s: float = Field(0.0, ge=0)
    eval_s: float = Field(0.0, ge=0)
    turns: int = Field(1, ge=0)
    fail_init_attempts: int = Field(0, ge=0, description="INIT raises InfraError this often")
    retry_run_s: float | None = Field(None, ge=0, description="run_s from attempt 2 on")


def _where() -> dict:
    return {"node": os.environ.get("RAAS_NODE"), "pid": os.getpid()}


@register
class SleepyHandler(AgentHandler):
    """Sleeps per stage (in slices, checking cancel), records turns, rewards sample parity."""

    name = "test-sleepy"
    Config = SleepyConfig
    needs_sandbox = False
    needs_llm = False

    def init(self, ctx: InitContext) -> None:
        if ctx.attempt <= ctx.agent_config.fail_init_attempts:
            raise InfraError(f"injected INIT failure on attempt {ctx.attempt}")
        time.sleep(ctx.agent_config.init_s)
        ctx.state["init"] = _where()

    def run(self, ctx: RunContext) -> Trajectory:
        cfg = ctx.agent_config
        turns = max(cfg.turns, 1)
        run_s = cfg.run_s if ctx.attempt == 1 or cfg.retry_run_s is None else cfg.retry_run_s
        for i in range(cfg.turns):
            ctx.checkpoint()
            time.sleep(run_s / turns)
            ctx.record_turn(index=i, text=f"turn {i}", generated_ids=[i, i + 1], logprobs=[-0.5, -0.25])
        if not cfg.turns:
            time.sleep(run_s)
        ctx.state["run"] = _where()
        return Trajectory(
            outcome="completed",
            finish_reason="stop",
            prompt_ids=[1, 2, 3],
            response_ids=[4, 5],
            response_logprobs=[-0.1, -0.2],
            loss_mask=[1, 1],
            messages=[{"role": "user", "content": ctx.instance_id}],
        )

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        time.sleep(ctx.agent_config.eval_s)
        ctx.state["eval"] = _where()
        return EvalResult(
            reward=float(ctx.sample_index % 2), extra={"where": {k: ctx.state.get(k) for k in ("init", "run", "eval")}}
        )


@register
class TrivialHandler(SleepyHandler):
    """The cheapest rollout: what the pipeline itself costs (benchmarks)."""

    name = "test-trivial"
    Config = HandlerConfig

    def init(self, ctx: InitContext) -> None:
        pass

    def run(self, ctx: RunContext) -> Trajectory:
        return Trajectory(
            outcome="completed",
            finish_reason="stop",
            response_ids=[1],
            loss_mask=[1],
            response_logprobs=[0.0],
            prompt_ids=[0],
        )

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        return EvalResult(reward=1.0)


@register
class NeedsLLMHandler(TrivialHandler):
    """Like test-trivial but declares that it needs an LLM (submission checks the spec)."""

    name = "test-needs-llm"
    needs_llm = True


@register
class SandboxedHandler(SleepyHandler):
    """Like test-sleepy, with a real sandbox started in INIT (what Ctrl-C must not leak)."""

    name = "test-sandboxed"
    needs_sandbox = True

    def init(self, ctx: InitContext) -> None:
        ctx.sandbox.write_file(f"{ctx.workspace}/started", "yes")
        super().init(ctx)


@register
class GradedHandler(SleepyHandler):
    """A real sandbox in INIT and a fresh one to grade in EVAL (warm-pool tests): the host
    writes the question, the agent its answer, the grader checks it in its own sandbox and
    reports which workspace folder each stage had."""

    name = "test-graded"
    needs_sandbox = True
    eval_in_sandbox = True

    def init(self, ctx: InitContext) -> None:
        Path(ctx.workspace, "question").write_text("6*7\n")  # the stage hands it over after
        ctx.state["init_ws"] = os.path.basename(ctx.workspace)

    def run(self, ctx: RunContext) -> Trajectory:
        out = ctx.sandbox.bash("echo $(( $(cat question) )) > answer && ls -A | tr '\\n' ' '")
        ctx.state["run_saw"] = out.output.strip()
        return Trajectory(
            outcome="completed",
            finish_reason="stop",
            prompt_ids=[1],
            response_ids=[2],
            response_logprobs=[-0.1],
            loss_mask=[1],
        )

    def artifact(self, ctx: RunContext, result: Trajectory) -> dict:
        return {"answer": Path(ctx.workspace, "answer").read_text().strip()}

    def prepare_eval(self, ctx: EvalContext, workspace: str) -> dict:
        Path(workspace, "answer").write_text(ctx.artifact["answer"] + "\n")
        return {"eval_ws": os.path.basename(workspace)}

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        out = ctx.sandbox.bash("cat answer; ls -A | tr '\\n' ' '; echo; id -u").output
        answer, seen, uid = out.splitlines()
        return EvalResult(
            reward=float(answer.strip() == "42"),
            extra={
                "init_ws": ctx.state.get("init_ws"),
                "eval_saw": seen.strip(),
                "run_saw": ctx.state.get("run_saw"),
                "eval_uid": uid.strip(),
            },
        )


class ChatConfig(AgentLoopConfig):
    """Turns per rollout (an instance's `turns` wins), and how much each observation adds."""

    turns: int = Field(4, ge=1, le=100)
    observation_words: int = Field(100, ge=0, le=5000, description="Words per tool result")
    tool_s: float = Field(0.0, ge=0, description="Seconds each tool call takes")


@register
class ChatHandler(AgentHandler):
    """A multi-turn LLM conversation without a sandbox (the routing bench's workload): every
    turn calls `observe`, whose result grows the prompt, until the rollout's turns are done."""

    name = "test-chat"
    Config = ChatConfig
    needs_sandbox = False

    def init(self, ctx: InitContext) -> None:
        pass

    def run(self, ctx: RunContext) -> Trajectory:
        cfg: ChatConfig = ctx.agent_config
        seen = [0]

        def observe(ctx: RunContext, arguments: dict) -> ToolOutput:
            seen[0] += 1
            time.sleep(cfg.tool_s)
            words = (f"{ctx.instance_id} part {seen[0]} line {k}." for k in range(cfg.observation_words // 5))
            return ToolOutput(" ".join(words))

        tool = Tool("observe", "Read the next part of the task", {"type": "object", "properties": {}}, observe)
        return run_agent_loop(
            ctx,
            system_prompt="You read a task part by part.",
            user_prompt=f"Task {ctx.instance_id}: observe every part.",
            tools=[tool],
            max_turns=int(ctx.instance.get("turns", cfg.turns)),
        )

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        """1.0 when RUN did every turn it was asked for (the work was real), else 0.0."""
        done = (ctx.run_result.metrics or {}).get("turns")
        wanted = int(ctx.instance.get("turns", ctx.agent_config.turns))
        return EvalResult(reward=float(done == wanted), metrics={"turns_done": done})


@register
class ResumableChatHandler(ChatHandler):
    """`test-chat` that a lost RUN continues from its logged turns (its tool's counter lives
    in `ctx.state`, which resume restores), so observations are the same either way."""

    name = "test-chat-resumable"
    resumable = True

    def run(self, ctx: RunContext) -> Trajectory:
        cfg: ChatConfig = ctx.agent_config

        def observe(ctx: RunContext, arguments: dict) -> ToolOutput:
            ctx.state["seen"] = ctx.state.get("seen", 0) + 1
            time.sleep(cfg.tool_s)
            return ToolOutput(f"{ctx.instance_id} part {ctx.state['seen']}.")

        tool = Tool("observe", "Read the next part of the task", {"type": "object", "properties": {}}, observe)
        return run_agent_loop(
            ctx,
            system_prompt="You read a task part by part.",
            user_prompt=f"Task {ctx.instance_id}: observe every part.",
            tools=[tool],
            max_turns=int(ctx.instance.get("turns", cfg.turns)),
        )
