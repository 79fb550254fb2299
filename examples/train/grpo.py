"""GRPO's data side in numpy: raas rows -> training samples with advantages (no torch here).

Kept torch-free so the project's CI (whose venv has no torch) tests the math that decides what
the trainer learns from: which samples count (infrastructure failures never do; groups without
reward variance carry no signal), the group-normalised advantages, the staleness bound of
one-step-off-policy training, and a numpy reference of the clipped surrogate that
`policy.grpo_loss` (torch) is checked against.

Why written here and not taken from TRL: TRL's GRPOTrainer generates its own completions (its
loss lives inside the trainer and expects its own batch layout); raas delivers finished,
token-exact groups with the behaviour policy's logprobs, so the trainer only needs these few
functions and the 20-line loss in `policy.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from raas_client import RolloutView


@dataclass
class Sample:
    """One rollout ready for the loss: tokens, the stored logprobs, mask and advantage."""

    rollout_id: str
    instance_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    loss_mask: list[int]
    reward: float
    advantage: float
    versions: list[Any]


@dataclass
class BatchStats:
    """What `build_samples` kept and why it dropped the rest (per-step CSV columns)."""

    rollouts: int = 0
    infra_excluded: int = 0
    stale_excluded: int = 0
    groups: int = 0
    groups_no_variance: int = 0
    samples: int = 0
    mean_reward: float = 0.0
    rewards: list[float] = field(default_factory=list)


def is_infra_failure(row: RolloutView) -> bool:
    """A row the policy is not to blame for: not a policy sample (raas' failure contract,
    `failure_class`: infra_error, timeout, cancelled, prompt_too_long and any outcome the SDK
    does not know), no reward, or no generated tokens."""
    return row.failure_class not in ("none", "policy") or row.reward is None or not row.response_ids


def version_number(version: Any) -> int | None:
    """`v12` / `12` -> 12 (the trainer names versions `v<step>`); anything else -> None."""
    text = str(version) if version is not None else ""
    text = text[1:] if text.startswith("v") else text
    return int(text) if text.isdigit() else None


def staleness(versions: Sequence[Any], trainer_version: int) -> int | None:
    """Updates between the oldest turn's weights and the trainer's; None if a turn has none."""
    numbers = [version_number(v) for v in versions]
    if not numbers or any(n is None for n in numbers):
        return None
    return trainer_version - min(numbers)  # type: ignore[type-var]


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> np.ndarray:
    """(r - mean) / (std + eps) within one group (population std, as in GRPO)."""
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean()) / (r.std() + eps)


def build_samples(
    groups: Iterable[list[RolloutView]], trainer_version: int, max_staleness: int | None = None
) -> tuple[list[Sample], BatchStats]:
    """Samples with advantages from raas groups (lists of result rows of one instance).

    Infrastructure failures and rows older than `max_staleness` updates are dropped before the
    group statistics; a group left with fewer than 2 samples or without reward variance is
    dropped whole (its advantages would all be 0: compute spent for no gradient).
    """
    stats, samples = BatchStats(), []
    for group in groups:
        stats.groups += 1
        stats.rollouts += len(group)
        kept = []
        for row in group:
            if is_infra_failure(row):
                stats.infra_excluded += 1
                continue
            stats.rewards.append(float(row.reward or 0.0))  # the step's reward, stale rows too
            lag = staleness(row.policy_versions or [], trainer_version)
            if max_staleness is not None and (lag is None or lag > max_staleness):
                stats.stale_excluded += 1
                continue
            kept.append(row)
        rewards = [float(r.reward or 0.0) for r in kept]
        if len(kept) < 2 or np.ptp(rewards) == 0:
            stats.groups_no_variance += 1
            continue
        for row, adv in zip(kept, group_advantages(rewards)):
            samples.append(_sample(row, float(adv)))
    stats.samples = len(samples)
    stats.mean_reward = float(np.mean(stats.rewards)) if stats.rewards else 0.0
    return samples, stats


def _sample(row: RolloutView, advantage: float) -> Sample:
    """A result row as a Sample; a row whose arrays disagree in length is a bug upstream."""
    response, mask, logprobs = row.response_ids or [], row.loss_mask or [], row.response_logprobs or []
    if len(mask) != len(response) or len(logprobs) != len(response):
        raise ValueError(f"rollout {row.rollout_id}: response_ids, loss_mask and response_logprobs differ in length")
    return Sample(
        row.rollout_id,
        row.instance_id,
        list(row.prompt_ids or []),
        list(response),
        [float(x) for x in logprobs],
        list(mask),
        float(row.reward or 0.0),
        advantage,
        list(row.policy_versions or []),
    )


def clipped_surrogate(
    new_logprobs: np.ndarray, old_logprobs: np.ndarray, advantages: np.ndarray, mask: np.ndarray, clip: float = 0.2
) -> tuple[float, float]:
    """(loss, clip fraction): PPO's clipped objective over masked tokens, token-mean.

    Arrays are [batch, tokens]; `advantages` is [batch] (one per sequence, GRPO). The reference
    the torch loss is tested against.
    """
    ratio = np.exp(new_logprobs - old_logprobs)
    adv = advantages[:, None]
    unclipped, clipped = ratio * adv, np.clip(ratio, 1 - clip, 1 + clip) * adv
    per_token = -np.minimum(unclipped, clipped)
    m = mask.astype(np.float64)
    loss = float((per_token * m).sum() / max(m.sum(), 1.0))
    was_clipped = (clipped < unclipped) & (m > 0)
    return loss, float(was_clipped.sum() / max(m.sum(), 1.0))
