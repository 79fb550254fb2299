"""The AgentHandler interface, typed against the per-stage contexts of `agents.contexts`.

A handler is three hooks, one per stage, plus a pydantic config validated at submission time.
The pipeline owns everything around them: claiming the rollout, starting and stopping the
sandbox, deadlines, cancel, persistence. Handlers only act through `ctx`: `InitContext` in
`init`, `RunContext` in `run` and `artifact`, `EvalContext` in `prepare_eval` and `evaluate`.
RUN returns the rollout's record, `Trajectory` (`raas_client.models`, the wire's own type).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from raas_client.models import Trajectory

from agents.contexts import EvalContext, InitContext, RolloutContext, RunContext
from core.settings import Settings

# The name RUN's result had before it became the wire's record type; handlers outside this
# repository (`RAAS_HANDLER_MODULES`) may still return it. Deprecated: use `Trajectory`.
RunResult = Trajectory


def answer_artifact(result: Trajectory) -> dict[str, Any]:
    """The default artifact: the finishing tool's answer (`result.extra["answer"]`), if any."""
    answer = (result.extra or {}).get("answer")
    return {} if answer is None else {"answer": answer}


if TYPE_CHECKING:
    from core.policy import Policy


class HandlerConfig(BaseModel):
    """Base of every handler's config (the job's `agent_config`); unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")


class AgentLoopConfig(HandlerConfig):
    """The names every agent-loop handler shares; a handler redeclares only its defaults."""

    system_prompt: str = Field("", description="System message")
    user_prompt: str = Field(
        "", description="User message template (instance fields as {placeholders}; `user_template` is its old name)"
    )
    max_turns: int | None = Field(None, ge=1, le=10_000, description="Overrides limits.max_turns")
    max_invalid_turns: int = Field(3, ge=1, le=100, description="Turns with no valid action -> agent_error")

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
    python_env: str | None = Field(
        None, description="Named sandbox Python environment for the agent's tools; null = system python"
    )


@dataclass
class EvalResult:
    """What EVAL produced: the reward and anything worth keeping (e.g. the git patch)."""

    reward: float
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


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
    # True when `run` serves an external harness's model calls (`agents.harness`): a lost RUN
    # is a new attempt whose harness starts over, and its calls that match the logged ones are
    # answered from the log (`agents.harness.replay`), never generated again.
    replays_calls: ClassVar[bool] = False
    # True when what `init` leaves in the workspace is the same for every sample of an instance
    # and does not depend on the workspace's path: a GRPO group's samples then fork one
    # prepared workspace copy-on-write (`tasks.sandboxing.group_layers`), each running `init_fork`.
    forkable_init: ClassVar[bool] = False

    def load_config(self, agent_config: dict[str, Any], settings: Settings) -> HandlerConfig:
        """The job's `agent_config` as this handler's `Config`, validated against the node's
        `settings` (the validation context: e.g. the roots a config may name files under)."""
        return self.Config.model_validate(agent_config, context={"settings": settings})

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

    def prompt(self, instance: dict[str, Any], config: HandlerConfig) -> tuple[str, str, list[Any]] | None:
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

    def sandbox_overrides(self, ctx: RolloutContext) -> dict[str, Any]:
        """Changes to the job's sandbox spec for this rollout (image, binds, env, limits).

        Asked before the sandbox starts: with the `InitContext` for RUN's sandbox, with the
        `EvalContext` for the grading one (`ctx.stage` says which).

        By default: the handler config's `python_env` (a named environment with the packages
        the agent's tools need), unless the job chose an environment itself.
        """
        env = getattr(ctx.agent_config, "python_env", None)
        if env is None or ctx.job_config.sandbox.python_env:
            return {}
        return {"python_env": env}

    @abstractmethod
    def init(self, ctx: InitContext) -> None:
        """INIT: prepare the started sandbox (copy the repo, write files, ...)."""

    def init_fork(self, ctx: InitContext) -> None:
        """INIT of one sample of a forked group: `ctx.workspace` already holds what `init`
        prepared once for the group (a private copy-on-write layer); set this sample's own
        `ctx.state` here. Default: nothing."""

    @abstractmethod
    def run(self, ctx: RunContext) -> Trajectory:
        """RUN: drive the multi-turn loop and return the trajectory."""

    def artifact(self, ctx: RunContext, result: Trajectory) -> dict[str, Any]:
        """RUN's end, after the sandbox was killed: what the agent produced (small JSON).

        `ctx.workspace` is the dead sandbox's workspace on the host: read it only with
        `sandbox.workspace` (no links followed, sizes capped); `result` is what `run` returned.
        By default the finishing tool's answer (`result.extra["answer"]`).
        """
        return answer_artifact(result)

    def prepare_eval(self, ctx: EvalContext, workspace: str) -> dict[str, Any] | None:
        """EVAL with `eval_in_sandbox`: fill the empty fresh `workspace` from the instance's
        clean state plus `ctx.artifact` (host side, before the grading sandbox starts).
        Returns facts worth keeping (merged into the result's `extra`), e.g. dropped files."""
        return None

    @abstractmethod
    def evaluate(self, ctx: EvalContext) -> EvalResult:
        """EVAL: the reward of `ctx.artifact` (ctx.run_result holds what RUN returned;
        ctx.sandbox is the fresh grading sandbox when `eval_in_sandbox`, else None)."""

    def on_failure(self, stage: str, ctx: RolloutContext, exc: BaseException) -> None:
        """Called when a stage raised; clean up handler-side resources. Must not raise."""
