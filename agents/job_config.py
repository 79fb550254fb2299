"""A job's configuration, typed once: validated at submission, stored with the job, and read
as this model by every stage, the reaper and the tools (defaults live here and nowhere else).

It sits in `agents/` because it is made of the agents' and the sandbox's own configs (sampling
and llm specs, sandbox options); the gateway's `JobCreate` reuses the same parts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agents.health_config import HealthConfig
from agents.llm.spec import LLMSpec, SamplingParams
from sandbox.spec import SandboxOptions


class Limits(BaseModel):
    """Per-rollout limits; stage deadlines count only while the stage runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(20, ge=1, le=10_000, description="Agent turns before stopping")
    max_tokens: int | None = Field(
        None,
        gt=0,
        description="Hard cap on GENERATED tokens over all turns (observations do "
        "not count); each request asks for at most what remains. The whole context (prompt + "
        "turns + observations) is bounded by llm.max_model_len instead",
    )
    continue_after_turn_length: bool = Field(
        True,
        description="A turn cut at sampling.max_tokens continues the episode (the model "
        "is told its reply was cut); false ends it with finish_reason turn_length",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="Most weight updates a rollout's turns may span (0 = all turns "
        "on one weight_version); see on_stale",
    )
    on_stale: Literal["mark", "stop"] = Field(
        "mark", description="Past max_staleness: mark (metrics.stale) or stop the episode (finish_reason stale)"
    )
    init_timeout: float = Field(600, gt=0, description="INIT deadline, seconds")
    run_timeout: float = Field(3600, gt=0, description="RUN deadline, seconds")
    eval_timeout: float = Field(600, gt=0, description="EVAL deadline, seconds")
    tool_timeout: float = Field(60, gt=0, description="Wall seconds per tool call")

    def stage_timeout(self, stage: str) -> float:
        """The deadline of stage `stage` (init, run or eval), in seconds."""
        return float(getattr(self, f"{stage}_timeout"))


class ResumePolicy(BaseModel):
    """What a rollout whose sandbox was lost does with its logged turns (docs/fault-tolerance.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replay: bool = Field(
        True,
        description="A rollout whose sandbox was lost (node loss, scancel, preemption) replays the "
        "logged tool calls of its last attempt into the rebuilt sandbox and continues from its last "
        "logged turn, generating no logged turn again; false restarts it from INIT and regenerates "
        "every turn",
    )
    on_divergence: Literal["restart", "continue"] = Field(
        "restart",
        description="A replayed tool call whose output differs from the logged observation: "
        "restart (a new attempt from INIT, every turn generated again) or continue (the policy's "
        "observations stay the logged ones); each divergence is in metrics.replay_divergences",
    )
    checkpoints: bool = Field(
        False,
        description="Save the workspace's changes since INIT at every turn boundary; a rollout "
        "whose sandbox was lost restores the latest checkpoint and replays only the turns after "
        "it (the workspace only: processes, the shell and Python sessions are not in it)",
    )
    checkpoint_max_bytes: int = Field(
        256 * 2**20,
        ge=1,
        le=64 * 2**30,
        description="Most bytes of changed file content one checkpoint holds; a turn over it "
        "saves none (counted in metrics.checkpoints) and a resume replays from the one before",
    )


class JobConfig(BaseModel):
    """What a job's rollouts run with (the `jobs.config` column)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sampling: SamplingParams = Field(default_factory=SamplingParams, description="Per-turn sampling parameters")
    limits: Limits = Field(default_factory=Limits, description="Turns, tokens and deadlines")
    sandbox: SandboxOptions = Field(default_factory=SandboxOptions, description="The job's sandbox options")
    llm: LLMSpec | None = Field(None, description="Servers and tokenizer (LLM agents only)")
    resume: ResumePolicy = Field(
        default_factory=ResumePolicy, description="Replay of a lost sandbox's logged turns (handler agents)"
    )
    agent_config: dict[str, Any] = Field(
        default_factory=dict, description="The handler's config, validated by its Config model"
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Caller's tags kept with the job (e.g. the ProRL job id that /cancel looks up)",
    )
    # Issue 37: the quarantine list a submission is checked against, and the health alerts.
    quarantine: str | None = Field(None, description="Quarantine list (raas validate) whose instances are refused")
    health: HealthConfig = Field(default_factory=HealthConfig, description="Live-health alert thresholds")

    @classmethod
    def load(cls, stored: dict[str, Any] | None) -> JobConfig:
        """The config of a stored job (validated at submission; read as the typed model)."""
        return cls.model_validate(stored or {})

    def dump(self) -> dict[str, Any]:
        """The JSON stored in `jobs.config`. Its sandbox holds only the options the job chose
        (none at its default), so a loaded config's `sandbox.model_fields_set` (and its
        limits') is the job's own choice: what the operator's policy judges
        (`core.policy.check_sandbox_options`), while the defaults it left alone come down to the
        operator's caps (`tasks.sandboxing.sandboxes`)."""
        stored = {
            **self.model_dump(mode="json"),
            "sandbox": self.sandbox.model_dump(mode="json", exclude_defaults=True),
        }
        if self.resume == ResumePolicy():  # a job that did not opt in stores what it always did
            del stored["resume"]
        return stored
