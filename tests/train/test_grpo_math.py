"""The trainer's data-side math (examples/train/grpo.py) in numpy: which samples count, their
advantages, staleness, and the clipped surrogate the torch loss is checked against."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from raas_client import RolloutView

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "train"))

from grpo import (
    build_samples,
    clipped_surrogate,
    group_advantages,
    staleness,
    version_number,
)


def row(
    instance: str, reward: float | None, outcome: str = "completed", versions: list | None = None, n: int = 3
) -> RolloutView:
    return RolloutView.model_validate(
        {
            "rollout_id": f"{instance}-{reward}-{outcome}",
            "job_id": "j",
            "sample_index": 0,
            "status": "done",
            "attempt": 1,
            "timing": {},
            "created_at": "2026-01-01T00:00:00Z",
            "instance_id": instance,
            "outcome": outcome,
            "reward": reward,
            "prompt_ids": [1, 2],
            "response_ids": list(range(10, 10 + n)),
            "response_logprobs": [-0.5] * n,
            "loss_mask": [1] * n,
            "policy_versions": versions or ["v3"],
        }
    )


def test_group_advantages_are_normalised_within_the_group() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    adv = group_advantages([1.0, 0.0, 0.0, 0.0])
    assert adv.sum() == pytest.approx(0.0, abs=1e-9) and adv[0] > 0 > adv[1]
    assert np.std(adv) == pytest.approx(1.0, abs=1e-5)


def test_infra_failures_leave_the_group_and_flat_groups_are_dropped() -> None:
    groups = [
        # an infra failure is not a 0: without it the group is 1, 0 -> signal
        [row("a", 1.0), row("a", 0.0), row("a", None, "infra_error")],
        # all right: no variance, no gradient
        [row("b", 1.0), row("b", 1.0), row("b", 1.0)],
        # only one real sample left: no group
        [row("c", 1.0), row("c", None, "cancelled"), row("c", 0.0, "infra_error")],
    ]
    samples, stats = build_samples(groups, trainer_version=3)
    assert [s.instance_id for s in samples] == ["a", "a"]
    # a deadline is infra too (raas' failure contract), an agent's own error is a sample
    timed_out = [row("d", 1.0), row("d", 0.0, "timeout"), row("d", 0.0, "agent_error")]
    samples_d, stats_d = build_samples([timed_out], trainer_version=3)
    assert stats_d.infra_excluded == 1 and [s.reward for s in samples_d] == [1.0, 0.0]
    unknown = [row("e", 1.0, "a_newer_outcome"), row("e", 0.0), row("e", 1.0)]  # unknown: infra
    assert build_samples([unknown], trainer_version=3)[1].infra_excluded == 1
    assert [round(s.advantage, 4) for s in samples] == [1.0, -1.0]
    assert (stats.groups, stats.groups_no_variance, stats.infra_excluded) == (3, 2, 3)
    assert stats.mean_reward == pytest.approx(5 / 6)  # rewards of the 6 real samples


def test_staleness_bound_uses_the_per_turn_versions() -> None:
    assert version_number("v12") == 12 and version_number("base") is None
    assert staleness(["v3", "v4"], trainer_version=4) == 1
    assert staleness(["v3", None], trainer_version=4) is None
    group = [
        row("a", 1.0, versions=["v4"]),
        row("a", 0.0, versions=["v3"]),
        row("a", 0.0, versions=["v2", "v4"]),
        row("a", 1.0, versions=["v4"]),
    ]
    samples, stats = build_samples([group], trainer_version=4, max_staleness=1)
    assert stats.stale_excluded == 1 and len(samples) == 3
    samples, stats = build_samples([group], trainer_version=4, max_staleness=0)
    # the two current rows both scored 1: no variance left, so nothing to train on
    assert stats.stale_excluded == 2 and samples == [] and stats.groups_no_variance == 1


def test_rows_with_inconsistent_arrays_are_refused() -> None:
    bad = row("a", 1.0)
    bad.loss_mask = [1, 1]
    with pytest.raises(ValueError, match="differ in length"):
        build_samples([[bad, row("a", 0.0)]], trainer_version=3)


def test_clipped_surrogate_on_fixed_numbers() -> None:
    old = np.log(np.array([[0.5, 0.5, 0.5]]))
    # ratios 1.0, 1.5 (clipped to 1.2 for a positive advantage), 0.5 (not clipped: min wins)
    new = np.log(np.array([[0.5, 0.75, 0.25]]))
    mask = np.array([[1, 1, 1]])
    loss, clip_fraction = clipped_surrogate(new, old, np.array([2.0]), mask, clip=0.2)
    assert loss == pytest.approx(-(2 * 1.0 + 2 * 1.2 + 2 * 0.5) / 3)
    assert clip_fraction == pytest.approx(1 / 3)
    # negative advantage: the ratio 0.5 is clipped at 0.8, the 1.5 is not
    loss, clip_fraction = clipped_surrogate(new, old, np.array([-1.0]), mask, clip=0.2)
    assert loss == pytest.approx((1.0 + 1.5 + 0.8) / 3)
    assert clip_fraction == pytest.approx(1 / 3)
    # masked tokens count for nothing
    loss, _ = clipped_surrogate(new, old, np.array([2.0]), np.array([[1, 0, 0]]), clip=0.2)
    assert loss == pytest.approx(-2.0)
