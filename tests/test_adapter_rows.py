"""What the framework adapters share (no framework needed): a raas row as a trainer sample,
and the failure rule (a row without a reward is never a reward-0 sample)."""

from __future__ import annotations

import pytest

from raas_client.adapters.rows import RaasRolloutFailed, sample_of, sampling_of

ROW = {
    "rollout_id": "r1",
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


def test_a_row_is_a_sample_with_aligned_arrays() -> None:
    s = sample_of(ROW)
    assert (s.prompt_ids, s.response_ids, s.loss_mask) == ([1, 2], [5, 6, 7, 8], [1, 1, 0, 1])
    assert s.logprobs == [-0.5, -0.1, 0.0, -0.2] and s.reward == 1.0 and s.turns == 2
    assert s.seconds == pytest.approx(1.3) and s.extra["raas_policy_versions"] == ["v1"]
    cut = sample_of(ROW, max_response=3)
    assert (cut.response_ids, cut.loss_mask, cut.logprobs) == ([5, 6, 7], [1, 1, 0], [-0.5, -0.1, 0.0])


def test_a_row_without_reward_is_raised_or_masked_never_reward_zero() -> None:
    failed = {**ROW, "status": "failed", "outcome": "infra_error", "reward": None, "error": "node lost"}
    with pytest.raises(RaasRolloutFailed, match="infra_error: node lost"):
        sample_of(failed)
    masked = sample_of(failed, on_failure="mask")
    assert masked.loss_mask == [0, 0, 0, 0] and masked.reward == 0.0
    assert masked.extra["raas_failed"] is True
    policy_failure = {**ROW, "outcome": "agent_error", "reward": 0.0}
    assert sample_of(policy_failure).loss_mask == [1, 1, 0, 1]  # a sample: trained as 0


def test_sampling_keeps_what_raas_knows() -> None:
    assert sampling_of({"temperature": 0.7, "top_p": 0.9, "logprobs": True, "n": 4, "max_tokens": None}) == {
        "temperature": 0.7,
        "top_p": 0.9,
    }
