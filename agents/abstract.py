"""The AgentHandler interface and what the pipeline hands it (`StageContext`).

A handler is three hooks, one per stage, plus a pydantic config validated at submission time.
The pipeline owns everything around them: claiming the rollout, starting and stopping the
sandbox, deadlines, cancel, persistence. Handlers only act through `ctx`.
"""
from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents.job_config import JobConfig, Limits
from core.errors import RolloutCancelled, StageTimeout

if TYPE_CHECKING:
    from agents.llm.session import LLMSession
    from core.policy import Policy
    from sandbox.toolserver.protocol import BashResult, PythonResult


class HandlerConfig(BaseModel):
    """Base of every handler's config (the job's `agent_config`); unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")


class AgentLoopConfig(HandlerConfig):
    """The names every agent-loop handler shares; a handler redeclares only its defaults."""

    system_prompt: str = Field("", description="System message")
    user_prompt: str = Field("", description="User message template (instance fields as "
                                             "{placeholders}; `user_template` is its old name)")
    max_turns: int | None = Field(None, ge=1, le=10_000, description="Overrides limits.max_turns")
    max_invalid_turns: int = Field(3, ge=1, le=100,
                                   description="Turns with no valid action -> agent_error")

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """`user_template` (the math and search handlers' old name) means `user_prompt`."""
        if isinstance(data, dict) and "user_template" in data and "user_prompt" not in data:
            data = {k if k != "user_template" else "user_prompt": v for k, v in data.items()}
        return data


class SandboxToolsConfig(AgentLoopConfig):
    """An agent-loop handler whose tools run in the sandbox."""

    tools: list[str] = Field(default_factory=list, description="Sandbox tools the agent gets")
    python_env: str | None = Field(None, description="Named sandbox Python environment for "
                                                     "the agent's tools; null = system python")


class AgentSandbox(Protocol):
    """What agents use of a sandbox (`sandbox.Sandbox` is one); tools go through this only."""

    @property
    def workspace(self) -> str:
        """The workspace path, identical on the host and inside the sandbox."""

    def bash(self, command: str, timeout: float | None = None) -> BashResult:
        """Run a command in the persistent shell."""

    def python(self, code: str, timeout: float | None = None) -> PythonResult:
        """Run code in the persistent Python session."""

    def edit(self, command: str, path: str, **kwargs: Any) -> str:
        """str_replace_editor; misuse raises `sandbox.ToolUsageError` (shown to the model)."""

    def read_file(self, path: str) -> str:
        """Text of a workspace file."""

    def write_file(self, path: str, content: str) -> None:
        """Create or overwrite a workspace file."""

    def reset(self) -> None:
        """Kill every tool process; the next call starts fresh."""


@dataclass
class RunResult:
    """What RUN produced: how the agent stopped and the token-exact trajectory."""

    outcome: str = "completed"  # core.models.Outcome value
    finish_reason: str | None = None
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    loss_mask: list[int] | None = None
    policy_versions: list[Any] | None = None
    token_exact: bool | None = None
    messages: list[dict[str, Any]] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalResult:
    """What EVAL produced: the reward and anything worth keeping (e.g. the git patch)."""

    reward: float
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class StageContext:
    """Everything a handler may touch during one stage of one rollout.

    `sandbox` is a client attached to the rollout's sandbox (None for runtime "none");
    `llm` is the rollout's LLM session (RUN only); `state` is a dict persisted between the
    stages of one attempt (small JSON); `record_turn` persists one turn before returning.
    """

    rollout_id: str
    job_id: str
    stage: str
    instance_id: str
    instance: dict[str, Any]
    sample_index: int
    attempt: int
    agent_config: HandlerConfig
    job_config: JobConfig
    deadline: float  # time.monotonic() value
    state: dict[str, Any]
    sandbox: AgentSandbox | None = None
    llm: LLMSession | None = None
    workspace: str | None = None
    record_turn: Callable[..., None] = lambda **turn: None
    cancel_check: Callable[[], bool] = lambda: False
    run_result: RunResult | None = None
    artifact: dict[str, Any] | None = None  # what RUN produced, stored before EVAL grades it
    # RUN: why a sandbox failure is the agent's doing ("disk_quota", "oom", ...), else None.
    diagnose: Callable[[BaseException], str | None] = lambda exc: None
    logger: logging.Logger | logging.LoggerAdapter | None = None
    # RUN resumed after its worker was lost: the attempt's logged turns (index order), which
    # `agents.loop.run_agent_loop` continues from in the same sandbox (see `resumable`).
    resume_turns: list[dict[str, Any]] | None = None

    def remaining(self) -> float:
        """Seconds left before this stage's deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def checkpoint(self) -> None:
        """Raise if the rollout was cancelled or the stage is out of time (between turns)."""
        if self.cancel_check():
            raise RolloutCancelled("rollout cancelled", rollout_id=self.rollout_id)
        if self.remaining() <= 0:
            raise StageTimeout(f"{self.stage} deadline passed", rollout_id=self.rollout_id)

    @property
    def limits(self) -> Limits:
        """The job's limits (max_turns, per-stage timeouts, tool_timeout, ...)."""
        return self.job_config.limits


class AgentHandler(ABC):
    """One kind of agent: how to prepare its sandbox, run it, and grade it.

    Grading never trusts the RUN sandbox: when RUN ends the pipeline kills it, asks
    `artifact(ctx)` for what the agent produced (read from the dead workspace without following
    anything in it), stores that on the rollout, and EVAL grades the stored artifact — in a
    fresh sandbox filled by `prepare_eval` when `eval_in_sandbox` is set, else on the host.
    Re-evaluation runs the same EVAL on the same stored artifact.
    """

    name: ClassVar[str]
    Config: ClassVar[type[HandlerConfig]] = HandlerConfig
    needs_sandbox: ClassVar[bool] = True
    needs_llm: ClassVar[bool] = True
    # Named sandbox Python environments this handler's configs ask for, with their pip
    # packages: a node builds one the first time a rollout needs it (`raas env build NAME`
    # ahead of time does the same), so a fresh home runs without a manual build step.
    environments: ClassVar[dict[str, tuple[str, ...]]] = {}
    eval_in_sandbox: ClassVar[bool] = False
    # True when `run` drives `agents.loop.run_agent_loop`, which continues a lost RUN from its
    # logged turns (`ctx.resume_turns`); other handlers restart from INIT when RUN is lost.
    resumable: ClassVar[bool] = False

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Reject an instance at submission time (raise `core.errors.InvalidRequest`)."""

    def check_instance(self, config: HandlerConfig, instance: dict[str, Any]) -> None:
        """Reject an instance at submission, knowing the job's config (default:
        `validate_instance`; a handler whose instance shape depends on its config overrides)."""
        self.validate_instance(instance)

    def check_policy(self, config: HandlerConfig, policy: Policy, admin: bool) -> None:
        """Hold the config's choices to the operator's policy at submission (raise
        `core.errors.InvalidRequest` naming the field and rule); the worker asks again."""

    def grades_in_sandbox(self, config: HandlerConfig) -> bool:
        """Whether EVAL grades in a fresh sandbox for this config (default `eval_in_sandbox`;
        a handler that grades several task kinds answers per config)."""
        return self.eval_in_sandbox

    def prompt(self, instance: dict[str, Any],
               config: HandlerConfig) -> tuple[str, str, list[Any]] | None:
        """(system prompt, user prompt, tools) of a rollout if known before INIT, else None.

        A handler that knows it lets a submission reject an instance whose prompt cannot fit
        the context, instead of running it to a `prompt_too_long` outcome.
        """
        return None

    def sandbox_needed(self, config: HandlerConfig) -> bool:
        """Whether a rollout with this agent config needs a sandbox (INIT starts none if not).

        By default the class's `needs_sandbox`; a handler whose sandbox only serves its tools
        answers per config (`math` with `tools: []` needs none)."""
        return self.needs_sandbox

    def sandbox_overrides(self, ctx: StageContext) -> dict[str, Any]:
        """Changes to the job's sandbox spec for this rollout (image, binds, env, limits).

        By default: the handler config's `python_env` (a named environment with the packages
        the agent's tools need), unless the job chose an environment itself.
        """
        env = getattr(ctx.agent_config, "python_env", None)
        if env is None or ctx.job_config.sandbox.python_env:
            return {}
        return {"python_env": env}

    @abstractmethod
    def init(self, ctx: StageContext) -> None:
        """INIT: prepare the started sandbox (copy the repo, write files, ...)."""

    @abstractmethod
    def run(self, ctx: StageContext) -> RunResult:
        """RUN: drive the multi-turn loop and return the trajectory."""

    def artifact(self, ctx: StageContext) -> dict[str, Any]:
        """RUN's end, after the sandbox was killed: what the agent produced (small JSON).

        `ctx.workspace` is the dead sandbox's workspace on the host: read it only with
        `sandbox.workspace` (no links followed, sizes capped). By default the finishing tool's
        answer (`run_result.extra["answer"]`).
        """
        answer = (ctx.run_result.extra or {}).get("answer") if ctx.run_result else None
        return {} if answer is None else {"answer": answer}

    def prepare_eval(self, ctx: StageContext, workspace: str) -> dict[str, Any] | None:
        """EVAL with `eval_in_sandbox`: fill the empty fresh `workspace` from the instance's
        clean state plus `ctx.artifact` (host side, before the grading sandbox starts).
        Returns facts worth keeping (merged into the result's `extra`), e.g. dropped files."""
        return None

    @abstractmethod
    def evaluate(self, ctx: StageContext) -> EvalResult:
        """EVAL: the reward of `ctx.artifact` (ctx.run_result holds what RUN returned;
        ctx.sandbox is the fresh grading sandbox when `eval_in_sandbox`, else None)."""

    def on_failure(self, stage: str, ctx: StageContext, exc: BaseException) -> None:
        """Called when a stage raised; clean up handler-side resources. Must not raise."""
