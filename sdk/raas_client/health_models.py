"""A job's live health on the wire (`GET /v1/jobs/{id}/health`, `Batch.health`).

Figures are computed from the job's finished rollouts, over all of them (`overall`), over the
last `window` (`recent`, what alerts judge) and per weight version. Rates are shares in [0, 1]:

| figure | meaning |
| --- | --- |
| `parse_failure_rate` | tool calls that did not parse / tool calls attempted |
| `truncation_rate` | rollouts with a reply cut at the token limit (finish `length`) |
| `reward_without_tools` | rewarded rollouts (reward > 0) that made no tool call / rewarded rollouts |
| `drift_rate` | rollouts whose drift audit found a re-render differing from the tokens |
| `infra_rate`, `timeout_rate` | rollouts of failure class infra / of outcome timeout |
| `zero_variance_groups` | groups (instances) whose rewards are all equal: no GRPO signal |

An `alert` is raised once when a figure of `recent` crosses the job's threshold
(`health` in the job's config) and cleared when it is back; it is pushed on the job's event
stream and to its callback URL.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from raas_client.models import Answer


class HealthFigures(Answer):
    """Health figures over a set of finished rollouts."""

    rollouts: int = Field(0, description="Finished rollouts counted")
    turns_mean: float | None = Field(None, description="Mean turns per rollout")
    turns_p50: float | None = Field(None, description="Median turns per rollout")
    turns_p90: float | None = Field(None, description="90th percentile of turns per rollout")
    turns_hist: dict[str, int] = Field(default_factory=dict, description="{turns: rollouts}; '10+' for ten or more")
    tool_calls_mean: float | None = Field(None, description="Mean parsed tool calls per rollout")
    parse_failure_rate: float | None = Field(None, description="Unparsable tool calls / attempted tool calls")
    truncation_rate: float | None = Field(None, description="Rollouts cut at the token limit")
    zero_tool_rollouts: float | None = Field(None, description="Rollouts that made no tool call")
    reward_without_tools: float | None = Field(None, description="Rewarded rollouts that made no tool call")
    drift_rate: float | None = Field(None, description="Rollouts with retokenization drift")
    infra_rate: float | None = Field(None, description="Rollouts of failure class infra")
    timeout_rate: float | None = Field(None, description="Rollouts of outcome timeout")
    reward_mean: float | None = Field(None, description="Mean reward of the rewarded samples")
    reward_var: float | None = Field(None, description="Variance of the rewards")
    group_reward_var_mean: float | None = Field(None, description="Mean of the per-group reward variances")
    zero_variance_groups: float | None = Field(None, description="Groups whose rewards are all equal")
    time_split: dict[str, float] = Field(
        default_factory=dict,
        description="Mean seconds per rollout: gen, tool (or harness), waiting, paused, other "
        "(the RUN's `metrics.time_split`), init, run, eval",
    )


class GroupHealth(Answer):
    """One group's rewards (an instance's samples)."""

    instance_id: str = Field(description="The group's instance")
    n: int = Field(description="Samples with a reward")
    mean: float | None = Field(None, description="Mean reward")
    var: float | None = Field(None, description="Reward variance (population)")


class AlertView(Answer):
    """A health threshold crossed by the job's recent rollouts."""

    name: str = Field(description="turns_collapse, parse_failures, reward_without_tools, truncation or infra")
    severity: str = Field(description="critical or warning")
    value: float = Field(description="The figure when raised")
    threshold: float = Field(description="The job's threshold")
    seq: int = Field(description="Finished rollouts of the job when raised (the event stream's id)")
    weight_version: str | None = Field(None, description="Newest weight version among the rollouts judged")
    message: str = Field(description="One line for people")
    action: str = Field(
        "none", description="What raas did: none, paused (on_critical: pause) or cancelled (on_critical: cancel)"
    )
    raised_at: datetime | None = Field(None, description="When raised")
    cleared_at: datetime | None = Field(None, description="When the figure was back within the threshold")


class HealthView(Answer):
    """A job's live health: figures overall, recent and per weight version, series, alerts."""

    job_id: str = Field(description="The job")
    window: int = Field(description="Rollouts in `recent`")
    overall: HealthFigures = Field(description="Over every finished rollout")
    recent: HealthFigures = Field(description="Over the last `window` finished rollouts (what alerts judge)")
    by_weight_version: dict[str, HealthFigures] = Field(default_factory=dict, description="Per weight version")
    groups: list[GroupHealth] = Field(default_factory=list, description="Reward mean/variance per group")
    bucket: int = Field(1, description="Rollouts per point of `series`")
    series: dict[str, list[float | None]] = Field(
        default_factory=dict,
        description="At the end of every bucket of `bucket` rollouts (completion order), the figure over the "
        "`window` rollouts ending there",
    )
    alerts: list[AlertView] = Field(default_factory=list, description="Alerts raised, oldest first")
