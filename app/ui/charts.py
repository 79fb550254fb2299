"""Numbers behind the job page: GRPO groups, stage histograms, throughput, the worst rollouts.

Pure functions over plain rows, so the page's figures can be tested without a browser and
the templates only draw what is computed here (inline SVG, no chart library).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

STAGES = ("init", "run", "eval")
N_BINS = 12


@dataclass
class Group:
    """One instance's samples: the GRPO group its advantages are computed over."""

    instance_id: str
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        """Rewards of the samples that have one (infra failures have none)."""
        return [s["reward"] for s in self.samples if s["reward"] is not None]

    @property
    def mean(self) -> float | None:
        """Mean reward of the group."""
        r = self.rewards
        return sum(r) / len(r) if r else None

    @property
    def std(self) -> float | None:
        """Population standard deviation (what GRPO normalises advantages by)."""
        r, m = self.rewards, self.mean
        return math.sqrt(sum((x - m) ** 2 for x in r) / len(r)) if r else None


def groups(rows: list[dict[str, Any]]) -> list[Group]:
    """Rollouts grouped by instance, samples in index order, instances in name order."""
    by_id: dict[str, Group] = {}
    for row in rows:
        by_id.setdefault(row["instance_id"], Group(row["instance_id"])).samples.append(row)
    for group in by_id.values():
        group.samples.sort(key=lambda s: s["sample_index"])
    return [by_id[k] for k in sorted(by_id)]


def histogram(values: list[float], n_bins: int = N_BINS) -> dict[str, Any]:
    """Equal-width bins from 0 to the largest value: {edges, counts, max_count, n}."""
    if not values:
        return {"edges": [], "counts": [], "max_count": 0, "n": 0}
    top = max(values) or 1.0
    width = top / n_bins
    counts = [0] * n_bins
    for v in values:
        counts[min(int(v / width), n_bins - 1)] += 1
    return {
        "edges": [round(width * i, 3) for i in range(n_bins + 1)],
        "counts": counts,
        "max_count": max(counts),
        "n": len(values),
    }


def stage_histograms(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A histogram of seconds per stage over the rollouts that went through it."""
    return {
        stage: histogram([r[f"{stage}_seconds"] for r in rows if r[f"{stage}_seconds"] is not None]) for stage in STAGES
    }


def throughput(rows: list[dict[str, Any]], start: datetime, n_bins: int = 30) -> dict[str, Any]:
    """Rollouts finished per bin from the job's submission to its last finish."""
    done = sorted(_seconds(r["finished_at"], start) for r in rows if r["finished_at"])
    if not done:
        return {"counts": [], "edges": [], "bin_seconds": 0, "max_count": 0, "span": 0, "n": 0}
    span = max(done[-1], 1e-3)
    width = span / n_bins
    counts = [0] * n_bins
    for t in done:
        counts[min(int(t / width), n_bins - 1)] += 1
    return {
        "counts": counts,
        "edges": [round(width * i, 2) for i in range(n_bins + 1)],
        "bin_seconds": round(width, 3),
        "max_count": max(counts),
        "span": round(span, 2),
        "n": len(done),
        "per_minute": round(len(done) / span * 60, 2),
    }


def _seconds(when: datetime, start: datetime) -> float:
    if (when.tzinfo is None) != (start.tzinfo is None):  # SQLite returns naive UTC
        when, start = when.replace(tzinfo=None), start.replace(tzinfo=None)
    return max(0.0, (when - start).total_seconds())


def total_seconds(row: dict[str, Any]) -> float:
    """Time spent in the stages (queue time excluded)."""
    return sum(row[f"{s}_seconds"] or 0.0 for s in STAGES)


def slowest(rows: list[dict[str, Any]], n: int = 10) -> list[dict[str, Any]]:
    """The n finished rollouts with the most stage time."""
    finished = [r for r in rows if r["finished_at"]]
    return sorted(finished, key=total_seconds, reverse=True)[:n]


def failed(rows: list[dict[str, Any]], n: int = 50) -> list[dict[str, Any]]:
    """Rollouts that ended other than completed (cancelled ones excluded), newest first."""
    bad = [r for r in rows if r["outcome"] not in (None, "completed", "cancelled")]
    return sorted(bad, key=lambda r: r["finished_at"] or r["created_at"], reverse=True)[:n]


def reward_range(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Smallest and largest reward of the job (0..1 when there are none or all equal)."""
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    lo, hi = (min(rewards), max(rewards)) if rewards else (0.0, 1.0)
    return (min(lo, 0.0), max(hi, 1.0)) if lo == hi or not rewards else (min(lo, 0.0), hi)
