"""The REST wire, typed once: request/response models shared by gateway, SDK and OpenAPI.

The answers (jobs, rollouts, result pages, servers, the error body) are defined in the SDK,
`raas_client.models` (its own distribution, `sdk/`), and imported here: the gateway serves the
very classes a trainer parses. The request models stay here: they validate against the
server's own vocabulary (sampling, limits, sandbox options, LLM specs).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

try:
    from raas_client.models import (
        AttemptView,
        ErrorBody,
        GroupList,
        GroupView,
        JobAccepted,
        JobList,
        JobView,
        LLMServerDeleted,
        LLMServerList,
        LLMServerView,
        ResultsPage,
        RolloutView,
        Timing,
        TurnView,
    )
    from raas_client.branch_models import BranchCreate, BranchesAccepted, BranchList
except ImportError as exc:  # the server installed without its SDK (`make` installs both)
    raise ImportError(
        "raas imports its wire models from the raas-client distribution in "
        "this repository: pip install -e ./sdk (then -e .)"
    ) from exc

from agents.health_config import HealthConfig
from agents.job_config import Limits, ResumePolicy
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
    resume: ResumePolicy = Field(
        default_factory=ResumePolicy, description="Replay of a lost sandbox's logged turns, workspace checkpoints"
    )
    llm: LLMSpec | None = Field(None, description="Servers/tokenizer; needed by LLM agents")
    agent_config: dict[str, Any] = Field(default_factory=dict, description="Handler config")
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Same key + same body: the same job and rollout ids (same order); another body: 409",
    )
    spare: int = Field(
        0,
        ge=0,
        le=1024,
        description="Extra samples per instance: a group "
        "completes with its first n_samples usable ones and the rest are cut",
    )
    group_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds after a group's first sample starts: the group then "
        "completes with what is usable (short if fewer than n_samples), the rest are cut",
    )
    priority: int = Field(
        0,
        ge=0,
        le=9,
        description="Higher first: this job's stage messages overtake those of lower-priority jobs in every queue",
    )
    callback_url: str | None = Field(
        None,
        min_length=8,
        max_length=2048,
        pattern=r"^https?://",
        description="POSTed (signed, retried) when a group and when the job completes",
    )
    quarantine: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        description="Name of a quarantine list written by `raas validate`: its instances are refused",
    )
    health: HealthConfig = Field(default_factory=HealthConfig, description="Live-health alert thresholds")

    @field_validator("instances")
    @classmethod
    def _unique_ids(cls, value: list[Instance]) -> list[Instance]:
        seen: set[str] = set()
        for inst in value:
            if inst.instance_id in seen:
                raise ValueError(f"duplicate instance_id {inst.instance_id!r}")
            seen.add(inst.instance_id)
        return value


class LLMServerCreate(ServerSpec):
    """Register an inference server (same fields and checks as a job's own server)."""

    backend: BackendName = Field("vllm", description="Wire protocol of the server")


class LLMServerUpdate(Strict):
    """Change a registered server: pause it for a weight update, resume it with a new version."""

    model: str | None = None
    weight_version: str | None = Field(None, description="Recorded with every later turn")
    backend: BackendName | None = None
    healthy: bool | None = None
    paused: bool | None = Field(None, description="true: generations wait (weights loading); false: resume")
    logprobs_mode: LogprobsMode | None = Field(None, description="The server's --logprobs-mode")

    @field_validator("backend", "healthy", "paused", "logprobs_mode", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:  # omit the field to leave it as it is; null is not a value here
            raise ValueError("may be omitted but not null")
        return value


__all__ = [
    "AttemptView",
    "BranchCreate",
    "BranchList",
    "BranchesAccepted",
    "ErrorBody",
    "GroupList",
    "GroupView",
    "Instance",
    "JobAccepted",
    "JobCreate",
    "JobList",
    "JobView",
    "LLMServerCreate",
    "LLMServerDeleted",
    "LLMServerList",
    "LLMServerUpdate",
    "LLMServerView",
    "ResultsPage",
    "RolloutView",
    "Strict",
    "Timing",
    "TurnView",
]
