"""The REST wire's answers, typed once: the gateway serves these models, the SDK parses them.

Plain pydantic, no SQL and nothing of the server, so a trainer installs them with httpx and
pydantic alone (`pip install ./sdk`). The gateway's `app/schemas.py` imports them (and keeps
only the request models that need its own validators: sampling, limits, sandbox, llm), so the
OpenAPI document, the server's answers and the SDK's rows come from one definition.

Answers ignore unknown fields when parsed (`extra="ignore"`): an older SDK reads a newer
gateway's rows. The side that builds an answer (the server) builds it with `Model.build(...)`,
where an unknown field (a misspelt one) is an error naming it instead of a silent drop.

`Trajectory` is the rollout record itself, the one type of a rollout's data from the server's
LLM layer to here (the server builds, stores and grades it; `RolloutView` extends it with the row's
identity, status, reward and timing).

**`failure_class`**, the trainer's contract on every finished sample (derived from `outcome`):

| failure_class | outcomes | reward for training | in group statistics |
| --- | --- | --- | --- |
| `none` | `completed` | the graded reward | yes |
| `policy` | `agent_error` (no valid action, disk quota, OOM, its own deadline: below) | reward or 0 | yes |
| `infra` | `infra_error`, `timeout`, `cancelled` | none | no (default): group reported short |
| `input` | `prompt_too_long` | none | no: cannot be sampled at this context |

**Deadlines: whose time ran out.** A RUN that passes its deadline (or a harness its own
`timeout`) ends with `finish_reason` `deadline` and the server decides the outcome from the
RUN's time split, stored in `metrics.time_split` (seconds: `generation`, `tools` or `harness`,
`waiting`, `paused`, `other`, and `agent_share`):

| the charged time (elapsed minus `paused`) | outcome | failure_class |
| --- | --- | --- |
| the agent's own actions (generation, tools, harness work) >= half | `agent_error`, reward 0 | `policy` |
| otherwise (mostly waiting on infrastructure) | `timeout` | `infra` |

Waiting is: no server or a stalled one, failed and retried requests, a request held by a
pausing pool. raas's own work (starting the session, logging turns) is not the agent's time
either: it lowers the agent's share.

Why: a policy cannot make the infrastructure wait, so stalling (tool calls that sleep to the
deadline, a reply rambling to it) is its own time and earns reward 0 in its group instead of
leaving the group; a rollout that lost most of its time to the infrastructure is not clearly
the policy's failure. Generation counts as the policy's up to what the pool is expected to
take (2 s + 20 tokens/s of the reply, or of the tokens a cut request asked for); a slower server
is waiting. A paused pool (a weight push) moves the deadline on and counts for neither. A
harness whose request the endpoint refused (an unsupported feature, a protocol error) or that
never got a call answered is `infra_error`, never `policy`. The decision is carried by
`outcome`, so an older SDK classifies the same (the wire did not change). A trainer can still
override a class per sample (`include_infra=True` in `collect()`, or its own filter on
`outcome`/`finish_reason`).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from typing_extensions import Self

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator, model_validator

FailureClass = Literal["none", "policy", "infra", "input"]
FAILURE_CLASSES: dict[str, FailureClass] = {
    "completed": "none",
    "agent_error": "policy",
    "infra_error": "infra",
    "timeout": "infra",
    "cancelled": "infra",
    "prompt_too_long": "input",
}


def failure_class_of(outcome: str | None) -> FailureClass | None:
    """The failure class of an outcome (None while the rollout runs); an outcome this SDK does
    not know is `infra`, so it never enters group statistics disguised as a policy sample."""
    if outcome is None:
        return None
    return FAILURE_CLASSES.get(outcome, "infra")


_TRAILING_INT = re.compile(r"(\d+)$")


def version_number(version: Any) -> int | None:
    """A policy version as an integer: the one a version string ends with (`"step-42"` -> 42,
    `"7"` -> 7), else None."""
    if isinstance(version, bool) or version is None:
        return None
    if isinstance(version, int):
        return version
    match = _TRAILING_INT.search(str(version).strip())
    return int(match.group(1)) if match else None


class Answer(BaseModel):
    """Base of the gateway's answers: unknown fields are ignored when parsed (forward
    compatible); `build` is the producer's strict constructor."""

    model_config = ConfigDict(extra="ignore")

    @classmethod
    def build(cls, **fields: Any) -> Self:
        """The answer built where it is produced (the server): an unknown field raises a
        ValidationError naming it (pydantic >= 2.12, the server's), where parsing drops it."""
        return cls.model_validate(fields, extra="forbid")


class JobAccepted(Answer):
    """202 answer to a submission (also returned again for a repeated idempotency key)."""

    job_id: str
    rollout_ids: list[str]
    created: bool = Field(description="False when the idempotency key matched a job")


class JobView(Answer):
    """A job with its progress."""

    job_id: str
    agent: str
    status: str = Field(description="running | paused | cancelling | done | cancelled")
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
    paused_at: datetime | None = Field(
        None, description="When the job was paused (its queued rollouts wait; started ones finish)"
    )
    pause_reason: str | None = Field(
        None, description="Who paused it: a trainer, or the critical health alert that did"
    )


class GroupView(Answer):
    """A group of a job that cuts stragglers: who is in it, who was cut, and why."""

    instance_id: str
    status: str = Field(description="open | complete | short")
    size: int | None = Field(None, description="Usable samples that complete it")
    members: list[str] = Field(
        default_factory=list,
        description="Rollout ids in the group, in finishing order (empty on the `group` event of a job "
        "without a straggler cut: its group is all its samples)",
    )
    cut: list[str] = Field(default_factory=list, description="Rollout ids stopped by the cut")
    reason: str | None = Field(None, description="Why it is short, or closed at its deadline")
    closer: str | None = Field(None, description="The rollout carrying group_complete")
    started_at: datetime | None = None
    closed_at: datetime | None = None


class GroupList(Answer):
    """GET /v1/jobs/{id}/groups: the group records of a job that cuts stragglers."""

    job_id: str
    groups: list[GroupView]


class JobList(Answer):
    """GET /v1/jobs page."""

    jobs: list[JobView]
    next_cursor: str | None = None


class TurnView(Answer):
    """One turn of a rollout."""

    model_config = ConfigDict(extra="ignore", from_attributes=True)

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
    extra: dict[str, Any] = Field(default_factory=dict, description="logprobs_mode, parse errors, staleness, ...")


class AttemptView(Answer):
    """An earlier attempt of a rollout: why it ended and the turns it had logged."""

    attempt: int
    error: str | None = None
    ended_at: str | None = None
    turns: list[TurnView] | None = None


class Timing(Answer):
    """Seconds spent in each stage (queue time excluded)."""

    init: float | None = None
    run: float | None = None
    eval: float | None = None


class TrainingSample(Answer):
    """One prefix-consistent sequence of a rollout that has several (a harness that rewrote
    its history: the endpoint split its calls); arrays aligned as on `RolloutView`."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    loss_mask: list[int] = Field(description="1 on generated tokens, 0 elsewhere")
    policy_versions: list[Any] = Field(default_factory=list, description="Weight version of each generated turn")
    turn_boundaries: list[list[int]] = Field(default_factory=list, description="[start, end) of each generated turn")
    finish_reason: str | None = None
    split_reason: str | None = Field(
        None,
        description="Why the sample before this one ended "
        "(history_rewritten, messages_dropped, system_changed, "
        "assistant_edited, tools_changed, ...); null for the first",
    )
    calls: int = Field(0, description="Model calls generated into this sample")


class Trajectory(Answer):
    """A rollout's record: how its episode ended and the token-exact trajectory.

    The one type of it from generation to the trainer: the LLM layer builds it turn by turn,
    a handler's RUN returns it, the stages store its fields as the rollout's columns and read
    them back for EVAL and re-evaluation, and the gateway serves it as the trajectory part of
    `RolloutView` (which extends it), which is what this SDK parses.

    The arrays align: `response_ids`, `response_logprobs` and `loss_mask` have one entry per
    response token; `extra.turn_boundaries` holds each generated turn's [start, end) in them
    and `policy_versions` each turn's weight version, in the same order.
    """

    outcome: str | None = Field(
        None,
        description="completed | agent_error | prompt_too_long | timeout | infra_error | cancelled; null while it runs",
    )
    finish_reason: str | None = None
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = Field(
        None,
        description="Generated turns (loss_mask 1) and the tool observations between "
        "them (loss_mask 0), as the model saw them",
    )
    response_logprobs: list[float] | None = Field(
        None,
        description="The sampling logprob of each response token; 0.0 where loss_mask "
        "is 0 (observation tokens were not sampled: a placeholder, never a "
        "probability) and where the server returned none",
    )
    loss_mask: list[int] | None = Field(None, description="1 on generated tokens, 0 on template and observation tokens")
    policy_versions: list[Any] | None = Field(
        None, description="Weight version of each generated turn (extra.turn_boundaries)"
    )
    token_exact: bool | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None

    @field_validator("metrics", "extra", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        """A stored rollout that has none yet reads as {} (the wire never carries null)."""
        return {} if value is None else value

    @property
    def turn_boundaries(self) -> list[list[int]]:
        """[start, end) of each generated turn in the response arrays."""
        return [list(b) for b in self.extra.get("turn_boundaries") or []]

    @property
    def message_token_counts(self) -> list[int]:
        """Tokens of each of `messages`: they add up to prompt + response (ProRL's shape)."""
        return list(self.extra.get("message_token_counts") or [])


TRAJECTORY_FIELDS = tuple(Trajectory.model_fields)  # also the rollout's columns of that name


class RolloutView(Trajectory):
    """A rollout: identity, status, reward and its trajectory (the fields of `Trajectory`)."""

    rollout_id: str
    job_id: str
    instance_id: str
    sample_index: int
    status: str
    error: str | None = None
    attempt: int
    node: str | None = None
    reward: float | None = Field(None, description="null unless graded: failures are never 0")
    timing: Timing
    seq: int | None = Field(None, description="Place in the job's completion order")
    group_complete: bool = Field(
        False,
        description="Closes its instance's group (the last sample to finish, or the one completing a straggler cut)",
    )
    cut_reason: str | None = Field(
        None,
        description="Cut from its group by a straggler cut (spare samples, group deadline): not one of its samples",
    )
    group: GroupView | None = Field(
        None, description="On the closing row of a job that cuts stragglers: its group's record"
    )
    created_at: datetime
    finished_at: datetime | None = None
    parent_rollout_id: str | None = Field(
        None, description="A branch: the rollout it continues (its turns 0..branch_turn are that rollout's)"
    )
    branch_turn: int | None = Field(None, description="A branch: the parent's turn it continues after")
    samples: list[TrainingSample] | None = Field(
        None,
        description="Every training sample in order when the rollout has several (a "
        "harness that rewrote its history); the arrays above are then the last one. Each "
        "sample trains with the rollout's reward (`training_rows`)",
    )
    turns: list[TurnView] | None = Field(
        None, description="Turns of the current attempt (the one the trajectory belongs to)"
    )
    earlier_attempts: list[AttemptView] | None = Field(
        None, description="Attempts that were retried, oldest first, with their own turns"
    )

    @computed_field(
        description="none | policy | infra | input (module table of raas_client.models); null while the rollout runs"
    )
    @property
    def failure_class(self) -> FailureClass | None:
        """How the trainer treats this sample (see the module docstring)."""
        return failure_class_of(self.outcome)

    @property
    def train_reward(self) -> float | None:
        """The reward a trainer uses: graded for `none`, 0 for a `policy` failure left
        ungraded, None for `infra`/`input` (excluded from training)."""
        cls = self.failure_class
        if cls == "none":
            return self.reward
        if cls == "policy":
            return self.reward if self.reward is not None else 0.0
        return None

    @model_validator(mode="before")
    @classmethod
    def _samples_from_extra(cls, data: Any) -> Any:
        """The server stores a split rollout's samples in its `extra["samples"]`; the wire
        carries them typed, as `samples` (and not twice)."""
        if isinstance(data, dict) and isinstance(data.get("extra"), dict) and "samples" in data["extra"]:
            extra = dict(data["extra"])
            data = {**data, "extra": extra}
            samples = extra.pop("samples")
            if data.get("samples") is None:
                data["samples"] = samples
        return data

    def training_rows(self) -> list[RolloutView]:
        """The rollout as training rows: itself, or one copy per sample (same reward, group
        and identity; the copy's arrays are the sample's)."""
        if not self.samples:
            return [self]
        return [
            self.model_copy(
                update={
                    "prompt_ids": s.prompt_ids,
                    "response_ids": s.response_ids,
                    "response_logprobs": s.response_logprobs,
                    "loss_mask": s.loss_mask,
                    "policy_versions": s.policy_versions,
                    "finish_reason": s.finish_reason,
                    "extra": {
                        **self.extra,
                        "turn_boundaries": s.turn_boundaries,
                        "sample": k,
                        "split_reason": s.split_reason,
                    },
                    "samples": None,
                }
            )
            for k, s in enumerate(self.samples)
        ]


class ResultsPage(Answer):
    """GET /v1/jobs/{id}/results: finished rollouts after `cursor`, in completion order."""

    job_id: str
    items: list[RolloutView]
    cursor: int = Field(description="Pass as `after` to get the next page")
    done: bool = Field(description="Every rollout of the job has finished")


class LLMServerView(Answer):
    """A registered inference server."""

    model_config = ConfigDict(extra="ignore", from_attributes=True)

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
    reachable: bool | None = Field(
        None, description="With ?probe=1: the server answered GET /v1/models from the gateway just now"
    )
    probe_error: str | None = Field(None, description="With ?probe=1: why it did not answer")
    served_models: list[str] | None = Field(None, description="With ?probe=1: the models it lists (ids and roots)")


class LLMServerList(Answer):
    """All registered servers."""

    servers: list[LLMServerView]


class LLMServerDeleted(Answer):
    """DELETE /v1/llm-servers/{id}: the server is no longer in the pool."""

    deleted: str = Field(description="The removed server's id")


class ErrorBody(Answer):
    """Every 4xx/5xx answer."""

    error: str
    message: str
    details: dict[str, Any] | None = None
