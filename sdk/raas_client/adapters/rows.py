"""What the framework adapters share: turning raas result rows into a trainer's samples.

A rollout is usually one sequence; a harness rollout whose program rewrote its history is
split into several (`RolloutView.samples`, the main arrays being the last). `samples_of`
gives every one of them, in order, each with the rollout's reward (the SDK's
`training_rows`); `sample_of` reads one row's main arrays (an unsplit rollout, or one
training row of a split one).

The failure rule is the SDK's: a rollout whose reward is null failed for a reason outside the
policy (infrastructure, a cancel, a prompt that does not fit) and must not be trained on as
reward 0. An adapter either raises `RaasRolloutFailed` for it (`on_failure="raise"`, the
default: the framework's own failure handling decides) or returns it masked out
(`on_failure="mask"`: loss mask all 0, reward 0.0, so it adds no gradient).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from raas_client.models import RolloutView

OnFailure = Literal["raise", "mask"]


class RaasRolloutFailed(RuntimeError):
    """A rollout ended without a reward (infrastructure), or a group slot has none (a short
    group): not a policy sample. `row` is the rollout, None for a missing slot."""

    def __init__(self, message: str, row: RolloutView | None = None) -> None:
        self.row = row
        super().__init__(message)

    @classmethod
    def of(cls, row: RolloutView) -> RaasRolloutFailed:
        """The failure of a finished rollout without a reward."""
        return cls(
            f"raas rollout {row.rollout_id} ({row.instance_id}#{row.sample_index}) ended "
            f"{row.status}/{row.outcome}: {row.error}",
            row,
        )


@dataclass
class Sample:
    """One trajectory as a trainer reads it (token lists, aligned)."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float
    finish_reason: str | None
    turns: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_last(self) -> bool:
        """The rollout's final sequence (the one a framework's per-trajectory fields describe)."""
        return self.extra.get("raas_sample", 0) == self.extra.get("raas_samples", 1) - 1


def samples_of(row: RolloutView, on_failure: OnFailure = "raise", max_response: int | None = None) -> list[Sample]:
    """Every training sample of one finished rollout, in order, each with its own ids, mask
    and logprobs and the rollout's reward: one for an unsplit rollout, one per
    `TrainingSample` of a split one. The failure rule applies to the rollout as a whole."""
    if row.reward is None and on_failure == "raise":
        raise RaasRolloutFailed.of(row)
    rows = row.training_rows()
    samples = [sample_of(r, on_failure, max_response) for r in rows]
    for k, (r, sample) in enumerate(zip(rows, samples)):
        sample.extra.update(raas_sample=k, raas_samples=len(rows), raas_split_reason=r.extra.get("split_reason"))
    return samples


def sample_of(row: RolloutView, on_failure: OnFailure = "raise", max_response: int | None = None) -> Sample:
    """The trainer's view of one finished row's main arrays (truncated to `max_response`
    tokens): the whole rollout when unsplit, only its last sample when split (`samples_of`
    gives them all)."""
    failed = row.reward is None
    if failed and on_failure == "raise":
        raise RaasRolloutFailed.of(row)
    response = list(row.response_ids or [])
    mask = list(row.loss_mask or [0] * len(response))
    logprobs = list(row.response_logprobs or [0.0] * len(response))
    if failed:
        mask = [0] * len(response)
    if max_response is not None and len(response) > max_response:
        response, mask, logprobs = (response[:max_response], mask[:max_response], logprobs[:max_response])
    timing = [row.timing.init, row.timing.run, row.timing.eval]
    return Sample(
        prompt_ids=list(row.prompt_ids or []),
        response_ids=response,
        loss_mask=mask,
        logprobs=logprobs,
        reward=0.0 if row.reward is None else float(row.reward),
        finish_reason=row.finish_reason,
        turns=int(row.metrics.get("turns") or 0),
        seconds=sum(v for v in timing if v is not None),
        extra={
            "raas_rollout_id": row.rollout_id,
            "raas_outcome": row.outcome,
            "raas_failed": failed,
            "raas_policy_versions": row.policy_versions,
            "raas_sample": 0,
            "raas_samples": 1,
            "raas_split_reason": None,
        },
    )


def missing_sample(instance_id: str | None, repetition: int, on_failure: OnFailure = "raise") -> Sample:
    """A group slot no rollout filled (the group completed short: a straggler cut): raised,
    or an empty sample that adds no gradient."""
    if on_failure == "raise":
        raise RaasRolloutFailed(
            f"raas group {instance_id} has no sample #{repetition}: the group completed short (straggler cut)"
        )
    return Sample(
        prompt_ids=[],
        response_ids=[],
        loss_mask=[],
        logprobs=[],
        reward=0.0,
        finish_reason=None,
        turns=0,
        seconds=0.0,
        extra={
            "raas_rollout_id": None,
            "raas_outcome": None,
            "raas_failed": True,
            "raas_policy_versions": None,
            "raas_sample": 0,
            "raas_samples": 1,
            "raas_split_reason": None,
        },
    )


def sampling_of(params: dict[str, Any] | None) -> dict[str, Any]:
    """A framework's sampling parameters as raas `sampling` (the fields raas knows)."""
    known = ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed")
    return {k: v for k, v in (params or {}).items() if k in known and v is not None}
