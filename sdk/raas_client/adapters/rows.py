"""What the framework adapters share: turning raas result rows into a trainer's sample.

The failure rule is the SDK's: a rollout whose reward is null failed for a reason outside the
policy (infrastructure, a cancel, a prompt that does not fit) and must not be trained on as
reward 0. An adapter either raises `RaasRolloutFailed` for it (`on_failure="raise"`, the
default: the framework's own failure handling decides) or returns it masked out
(`on_failure="mask"`: loss mask all 0, reward 0.0, so it adds no gradient).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

OnFailure = Literal["raise", "mask"]


class RaasRolloutFailed(RuntimeError):
    """A rollout ended without a reward (infrastructure): not a policy sample."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row
        super().__init__(
            f"raas rollout {row.get('rollout_id')} ({row.get('instance_id')}#"
            f"{row.get('sample_index')}) ended {row.get('status')}/"
            f"{row.get('outcome')}: {row.get('error')}"
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


def sample_of(row: dict[str, Any], on_failure: OnFailure = "raise", max_response: int | None = None) -> Sample:
    """The trainer's view of one finished row (truncated to `max_response` tokens)."""
    failed = row.get("reward") is None
    if failed and on_failure == "raise":
        raise RaasRolloutFailed(row)
    response = list(row.get("response_ids") or [])
    mask = list(row.get("loss_mask") or [0] * len(response))
    logprobs = list(row.get("response_logprobs") or [0.0] * len(response))
    if failed:
        mask = [0] * len(response)
    if max_response is not None and len(response) > max_response:
        response, mask, logprobs = (response[:max_response], mask[:max_response], logprobs[:max_response])
    timing = row.get("timing") or {}
    metrics = row.get("metrics") or {}
    return Sample(
        prompt_ids=list(row.get("prompt_ids") or []),
        response_ids=response,
        loss_mask=mask,
        logprobs=logprobs,
        reward=0.0 if failed else float(row["reward"]),
        finish_reason=row.get("finish_reason"),
        turns=int(metrics.get("turns") or 0),
        seconds=sum(v for v in timing.values() if v is not None),
        extra={
            "raas_rollout_id": row.get("rollout_id"),
            "raas_outcome": row.get("outcome"),
            "raas_failed": failed,
            "raas_policy_versions": row.get("policy_versions"),
        },
    )


def sampling_of(params: dict[str, Any] | None) -> dict[str, Any]:
    """A framework's sampling parameters as raas `sampling` (the fields raas knows)."""
    known = ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed")
    return {k: v for k, v in (params or {}).items() if k in known and v is not None}
