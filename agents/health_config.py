"""A job's live-health alert thresholds (`JobConfig.health`), validated at submission.

Each rate is judged over the job's last `window` finished rollouts once `min_rollouts` have
finished; a threshold set to null turns its alert off. `app.health` computes the figures and
raises the alerts; which alerts are critical, and whether a critical one cancels the job, is
the job's choice here. Pausing a job (no new INIT until resumed) is not offered: INIT claims
every queued rollout of a job and has no hold state, so a job that must stop cancels.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

AlertName = Literal["turns_collapse", "parse_failures", "reward_without_tools", "truncation", "infra"]


class HealthConfig(BaseModel):
    """Thresholds of the health alerts and what a critical alert does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(20, ge=2, le=10_000, description="Alerts judge the last this many finished rollouts")
    min_rollouts: int = Field(8, ge=1, le=10_000, description="No alert before this many rollouts finished")
    turns_mean_at_most: float | None = Field(
        1.5, ge=0, description="turns_collapse: mean turns per rollout at or below this"
    )
    parse_failure_rate_at_least: float | None = Field(
        0.2, ge=0, le=1, description="parse_failures: share of attempted tool calls whose markup did not parse"
    )
    reward_without_tools_at_least: float | None = Field(
        0.5, ge=0, le=1, description="reward_without_tools: share of rewarded rollouts that made no tool call"
    )
    truncation_rate_at_least: float | None = Field(
        0.3, ge=0, le=1, description="truncation: share of rollouts with a turn cut at the token limit"
    )
    infra_rate_at_least: float | None = Field(
        0.2, ge=0, le=1, description="infra: share of rollouts whose failure class is infra"
    )
    critical: list[AlertName] = Field(
        default_factory=lambda: ["infra"], description="Alerts that are critical (the others are warnings)"
    )
    on_critical: Literal["alert", "pause", "cancel"] = Field(
        "alert",
        description="What a critical alert does besides alerting: pause holds the job's queued "
        "rollouts until `POST /v1/jobs/{id}/resume` (started ones finish); cancel stops the job "
        "(queued rollouts never start, running ones stop at their next turn)",
    )
