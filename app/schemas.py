"""The REST wire, typed once: request/response models shared by gateway, SDK and OpenAPI."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agents.job_config import Limits
from agents.llm.spec import BackendName, LLMSpec, LogprobsMode, SamplingParams, ServerSpec
from sandbox.spec import SandboxOptions


class Strict(BaseModel):
    """Base of request models: unknown fields are an error naming the field."""

    model_config = ConfigDict(extra="forbid")


class Instance(Strict):
    """One task instance; `data` is what the agent handler reads."""

    instance_id: str = Field(min_length=1, max_length=256, description="Unique within the job")
    data: dict[str, Any] = Field(default_factory=dict, description="Handler-specific fields")


class JobCreate(Strict):
    """POST /v1/jobs: run `agent` on every instance `n_samples` times."""

    agent: str = Field(min_length=1, description="Registered handler name")
    instances: list[Instance] = Field(min_length=1, max_length=100_000)
    n_samples: int = Field(1, ge=1, le=1024, description="GRPO group size per instance")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    limits: Limits = Field(default_factory=Limits)
    sandbox: SandboxOptions = Field(default_factory=SandboxOptions)
    llm: LLMSpec | None = Field(None, description="Servers/tokenizer; needed by LLM agents")
    agent_config: dict[str, Any] = Field(default_factory=dict, description="Handler config")
    idempotency_key: str | None = Field(None, min_length=1, max_length=256,
                                        description="Same key + same body: the same job and "
                                                    "rollout ids (same order); another body: 409")
    spare: int = Field(0, ge=0, le=1024, description="Extra samples per instance: a group "
                       "completes with its first n_samples usable ones and the rest are cut")
    group_timeout: float | None = Field(
        None, gt=0, description="Seconds after a group's first sample starts: the group then "
        "completes with what is usable (short if fewer than n_samples), the rest are cut")
    priority: int = Field(0, ge=0, le=9, description="Higher first: this job's stage messages "
                          "overtake those of lower-priority jobs in every queue")
    callback_url: str | None = Field(
        None, min_length=8, max_length=2048, pattern=r"^https?://",
        description="POSTed (signed, retried) when a group and when the job completes")

    @field_validator("instances")
    @classmethod
    def _unique_ids(cls, value: list[Instance]) -> list[Instance]:
        seen: set[str] = set()
        for inst in value:
            if inst.instance_id in seen:
                raise ValueError(f"duplicate instance_id {inst.instance_id!r}")
            seen.add(inst.instance_id)
        return value


class JobAccepted(BaseModel):
    """202 answer to a submission (also returned again for a repeated idempotency key)."""

    job_id: str
    rollout_ids: list[str]
    created: bool = Field(description="False when the idempotency key matched a job")


class JobView(BaseModel):
    """A job with its progress."""

    job_id: str
    agent: str
    status: str = Field(description="running | done | cancelled")
    n_instances: int
    n_samples: int
    n_rollouts: int
    finished: int
    progress: float
    counts: dict[str, int] = Field(description="Rollouts per status")
    outcomes: dict[str, int] = Field(description="Finished rollouts per outcome")
    created_at: datetime
    finished_at: datetime | None = None
    idempotency_key: str | None = None
    spare: int = Field(0, description="Extra samples per instance (straggler cut)")
    priority: int = 0
    callback_url: str | None = None


class GroupView(BaseModel):
    """A group of a job that cuts stragglers: who is in it, who was cut, and why."""

    instance_id: str
    status: str = Field(description="open | complete | short")
    size: int | None = Field(None, description="Usable samples that complete it")
    members: list[str] = Field(description="Rollout ids in the group, in finishing order")
    cut: list[str] = Field(default_factory=list, description="Rollout ids stopped by the cut")
    reason: str | None = Field(None, description="Why it is short, or closed at its deadline")
    closer: str | None = Field(None, description="The rollout carrying group_complete")
    started_at: datetime | None = None
    closed_at: datetime | None = None


class GroupList(BaseModel):
    """GET /v1/jobs/{id}/groups: the group records of a job that cuts stragglers."""

    job_id: str
    groups: list[GroupView]


class JobList(BaseModel):
    """GET /v1/jobs page."""

    jobs: list[JobView]
    next_cursor: str | None = None


class TurnView(BaseModel):
    """One turn of a rollout."""

    model_config = ConfigDict(from_attributes=True)

    index: int
    attempt: int
    created_at: datetime
    text: str | None = None
    generated_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    observation: str | None = None
    observation_ids: list[int] | None = None
    finish_reason: str | None = None
    llm_server: str | None = None
    weight_version: str | None = None
    gen_seconds: float | None = None
    tool_seconds: float | None = None
    extra: dict[str, Any] = Field(default_factory=dict,
                                  description="logprobs_mode, parse errors, staleness, ...")


class AttemptView(BaseModel):
    """An earlier attempt of a rollout: why it ended and the turns it had logged."""

    attempt: int
    error: str | None = None
    ended_at: str | None = None
    turns: list[TurnView] | None = None


class Timing(BaseModel):
    """Seconds spent in each stage (queue time excluded)."""

    init: float | None = None
    run: float | None = None
    eval: float | None = None


class RolloutView(BaseModel):
    """A rollout: identity, status, outcome, reward and the token-exact trajectory."""

    rollout_id: str
    job_id: str
    instance_id: str
    sample_index: int
    status: str
    outcome: str | None = None
    error: str | None = None
    attempt: int
    node: str | None = None
    reward: float | None = None
    finish_reason: str | None = None
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    loss_mask: list[int] | None = None
    policy_versions: list[Any] | None = None
    token_exact: bool | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None
    timing: Timing
    seq: int | None = Field(None, description="Place in the job's completion order")
    group_complete: bool = Field(False, description="Closes its instance's group (the last "
                                 "sample to finish, or the one completing a straggler cut)")
    cut_reason: str | None = Field(None, description="Cut from its group by a straggler cut: "
                                   "never one of the group's members")
    group: GroupView | None = Field(None, description="On the closing row of a job that cuts "
                                    "stragglers: its group's record")
    created_at: datetime
    finished_at: datetime | None = None
    turns: list[TurnView] | None = Field(
        None, description="Turns of the current attempt (the one the trajectory belongs to)")
    earlier_attempts: list[AttemptView] | None = Field(
        None, description="Attempts that were retried, oldest first, with their own turns")


class ResultsPage(BaseModel):
    """GET /v1/jobs/{id}/results: finished rollouts after `cursor`, in completion order."""

    job_id: str
    items: list[RolloutView]
    cursor: int = Field(description="Pass as `after` to get the next page")
    done: bool = Field(description="Every rollout of the job has finished")


class LLMServerCreate(ServerSpec):
    """Register an inference server (same fields and checks as a job's own server)."""

    backend: BackendName = Field("vllm", description="Wire protocol of the server")


class LLMServerUpdate(Strict):
    """Change a registered server: pause it for a weight update, resume it with a new version."""

    model: str | None = None
    weight_version: str | None = Field(None, description="Recorded with every later turn")
    backend: BackendName | None = None
    healthy: bool | None = None
    paused: bool | None = Field(None, description="true: generations wait (weights loading); "
                                "false: resume")
    logprobs_mode: LogprobsMode | None = Field(None, description="The server's --logprobs-mode")


class LLMServerView(BaseModel):
    """A registered inference server."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    url: str
    model: str | None = None
    weight_version: str | None = None
    backend: str
    healthy: bool
    paused: bool = False
    logprobs_mode: str = "raw_logprobs"
    in_flight: int
    last_error: str | None = None


class LLMServerList(BaseModel):
    """All registered servers."""

    servers: list[LLMServerView]


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer."""

    error: str
    message: str
    details: dict[str, Any] | None = None
