"""What the framework adapters share (no framework needed): a raas row as a trainer sample,
and the failure rule (a row without a reward is never a reward-0 sample)."""

from __future__ import annotations

import pytest

from raas_client.adapters.rows import RaasRolloutFailed, missing_sample, sample_of, sampling_of
from raas_client.models import RolloutView

ROW = {
    "rollout_id": "r1",
    "job_id": "j",
    "attempt": 1,
    "created_at": "2026-01-01T00:00:00Z",
    "instance_id": "i",
    "sample_index": 0,
    "status": "done",
    "outcome": "completed",
    "reward": 1.0,
    "prompt_ids": [1, 2],
    "finish_reason": "stop",
    "response_ids": [5, 6, 7, 8],
    "loss_mask": [1, 1, 0, 1],
    "response_logprobs": [-0.5, -0.1, 0.0, -0.2],
    "metrics": {"turns": 2},
    "timing": {"init": 0.1, "run": 1.0, "eval": 0.2},
    "policy_versions": ["v1"],
}


def row(**fields) -> RolloutView:
    """ROW with `fields` changed, as the SDK gives it."""
    return RolloutView.model_validate({**ROW, **fields})


def test_a_row_is_a_sample_with_aligned_arrays() -> None:
    s = sample_of(row())
    assert (s.prompt_ids, s.response_ids, s.loss_mask) == ([1, 2], [5, 6, 7, 8], [1, 1, 0, 1])
    assert s.logprobs == [-0.5, -0.1, 0.0, -0.2] and s.reward == 1.0 and s.turns == 2
    assert s.seconds == pytest.approx(1.3) and s.extra["raas_policy_versions"] == ["v1"]
    cut = sample_of(row(), max_response=3)
    assert (cut.response_ids, cut.loss_mask, cut.logprobs) == ([5, 6, 7], [1, 1, 0], [-0.5, -0.1, 0.0])


def test_a_row_without_reward_is_raised_or_masked_never_reward_zero() -> None:
    failed = row(status="failed", outcome="infra_error", reward=None, error="node lost")
    with pytest.raises(RaasRolloutFailed, match="infra_error: node lost"):
        sample_of(failed)
    masked = sample_of(failed, on_failure="mask")
    assert masked.loss_mask == [0, 0, 0, 0] and masked.reward == 0.0
    assert masked.extra["raas_failed"] is True
    policy_failure = row(outcome="agent_error", reward=0.0)
    assert sample_of(policy_failure).loss_mask == [1, 1, 0, 1]  # a sample: trained as 0


def test_a_slot_a_short_group_left_empty_is_raised_or_masked() -> None:
    with pytest.raises(RaasRolloutFailed, match="no sample #2") as err:
        missing_sample("i", 2)
    assert err.value.row is None
    masked = missing_sample("i", 2, on_failure="mask")
    assert masked.reward == 0.0 and masked.loss_mask == [] and masked.extra["raas_failed"] is True


def test_sampling_keeps_what_raas_knows() -> None:
    assert sampling_of({"temperature": 0.7, "top_p": 0.9, "logprobs": True, "n": 4, "max_tokens": None}) == {
        "temperature": 0.7,
        "top_p": 0.9,
    }
