"""What the framework adapters share (`raas_client.adapters.rows`): a split rollout's every
training sample, in order, with its own arrays and the rollout's reward; an unsplit one as
before; the failure rule over the whole rollout. Typed `RolloutView`s as the wire parses them
(the split shape is the endpoint's: `extra["samples"]`, main arrays = the last sample)."""

from __future__ import annotations

from typing import Any

import pytest

from raas_client.adapters.rows import RaasRolloutFailed, missing_sample, sample_of, samples_of
from raas_client.models import RolloutView

FIRST = {
    "prompt_ids": [1, 2, 3],
    "response_ids": [10, 11, 12, 13, 14],
    "response_logprobs": [-0.1, -0.2, 0.0, 0.0, -0.3],
    "loss_mask": [1, 1, 0, 0, 1],
    "policy_versions": ["v1", "v1"],
    "turn_boundaries": [[0, 2], [4, 5]],
    "finish_reason": "stop",
    "split_reason": None,
    "calls": 2,
}
SECOND = {
    "prompt_ids": [1, 2, 9],
    "response_ids": [20, 21, 22],
    "response_logprobs": [-0.4, -0.5, -0.6],
    "loss_mask": [1, 1, 1],
    "policy_versions": ["v2"],
    "turn_boundaries": [[0, 3]],
    "finish_reason": "tool_calls",
    "split_reason": "history_rewritten",
    "calls": 1,
}


def rollout(reward: float | None = 1.0, split: bool = True, **fields: Any) -> RolloutView:
    """A finished harness rollout as the results wire carries it."""
    last = SECOND if split else FIRST
    extra: dict[str, Any] = {"turn_boundaries": last["turn_boundaries"]}
    if split:
        extra["samples"] = [FIRST, SECOND]
    return RolloutView.model_validate(
        {
            "rollout_id": "r1",
            "job_id": "j1",
            "instance_id": "i1",
            "sample_index": 0,
            "status": "done" if reward is not None else "failed",
            "outcome": "completed" if reward is not None else "infra_error",
            "attempt": 1,
            "reward": reward,
            "timing": {"init": 0.5, "run": 2.0, "eval": 0.25},
            "created_at": "2026-01-01T00:00:00Z",
            "metrics": {"turns": 3},
            **{k: last[k] for k in ("prompt_ids", "response_ids", "response_logprobs", "loss_mask")},
            "policy_versions": last["policy_versions"],
            "finish_reason": last["finish_reason"],
            "extra": extra,
            **fields,
        }
    )


def test_every_sample_of_a_split_rollout_with_its_arrays_and_the_rollouts_reward() -> None:
    row = rollout(reward=0.75)
    assert len(row.samples) == 2
    first, second = samples_of(row)
    for sample, want in ((first, FIRST), (second, SECOND)):
        assert sample.prompt_ids == want["prompt_ids"] and sample.response_ids == want["response_ids"]
        assert sample.loss_mask == want["loss_mask"] and sample.logprobs == want["response_logprobs"]
        assert sample.finish_reason == want["finish_reason"] and sample.reward == 0.75
        assert sample.extra["raas_rollout_id"] == "r1" and sample.seconds == 2.75
    assert [s.extra["raas_sample"] for s in (first, second)] == [0, 1]
    assert [s.extra["raas_samples"] for s in (first, second)] == [2, 2]
    assert [s.extra["raas_split_reason"] for s in (first, second)] == [None, "history_rewritten"]
    assert [s.extra["raas_policy_versions"] for s in (first, second)] == [["v1", "v1"], ["v2"]]
    assert (first.is_last, second.is_last) == (False, True)
    # sample_of still reads the main arrays: the last sample
    assert sample_of(row).response_ids == second.response_ids and sample_of(row).is_last


def test_an_unsplit_rollout_is_one_sample_as_before() -> None:
    row = rollout(split=False)
    assert row.samples is None
    [only] = samples_of(row)
    assert only.response_ids == FIRST["response_ids"] and only.loss_mask == FIRST["loss_mask"]
    assert only.reward == 1.0 and only.is_last and only.extra["raas_samples"] == 1
    assert only == sample_of(row)


def test_a_failed_split_rollout_raises_or_masks_every_sample() -> None:
    row = rollout(reward=None, error="node lost")
    with pytest.raises(RaasRolloutFailed, match="infra_error: node lost") as caught:
        samples_of(row)
    assert caught.value.row is row
    masked = samples_of(row, on_failure="mask")
    assert [s.loss_mask for s in masked] == [[0] * 5, [0] * 3]
    assert [s.response_ids for s in masked] == [FIRST["response_ids"], SECOND["response_ids"]]
    assert all(s.reward == 0.0 and s.extra["raas_failed"] for s in masked)


def test_each_sample_is_truncated_on_its_own() -> None:
    first, second = samples_of(rollout(), max_response=4)
    assert first.response_ids == FIRST["response_ids"][:4] and len(first.loss_mask) == len(first.logprobs) == 4
    assert second.response_ids == SECOND["response_ids"]  # shorter: untouched


def test_a_missing_slot_is_one_last_sample() -> None:
    with pytest.raises(RaasRolloutFailed, match="no sample #1"):
        missing_sample("i1", 1)
    empty = missing_sample("i1", 1, on_failure="mask")
    assert empty.is_last and empty.response_ids == [] and empty.reward == 0.0
