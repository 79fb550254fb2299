"""A harness job's model-API figures, summed over its rollouts: what the job page shows.

Each harness rollout stores what its endpoint saw (`agents.counters.EndpointCounters` in
`metrics`): calls, samples, merges and splits with their reasons, parse failures, demanded tool
calls the policy did not make, API errors and refusals, streamed calls' time to first token.
One rollout's numbers say little; the job's say whether a harness talks to raas the way it
should: splits climbing mean the harness rewrites its history (several training sequences
per rollout), refusals that raas does not speak part of its dialect, parse failures that the
policy's tool-call format and the template disagree.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents.counters import metric_count
from core.models import TERMINAL_VALUES, Rollout

COUNTS = ("calls", "failed_calls", "samples", "merges", "splits", "tool_choice_unmet", "streamed_calls")


@dataclass
class HarnessFigures:
    """Sums over a harness job's finished rollouts."""

    rollouts: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    parse_failures: int = 0  # tool-call markup that did not parse (`malformed_tool_calls`)
    split_reasons: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)
    ttft_ms_p50: float | None = None  # the median of the rollouts' medians
    ttft_ms_max: float | None = None

    @property
    def samples_per_rollout(self) -> float | None:
        return round(self.counts["samples"] / self.rollouts, 2) if self.rollouts else None


def job_harness_figures(s: Session, job_id: str) -> HarnessFigures:
    """The figures of a job's finished rollouts (their stored `metrics`)."""
    rows = s.scalars(select(Rollout.metrics).where(Rollout.job_id == job_id, Rollout.status.in_(TERMINAL_VALUES))).all()
    return harness_figures([m or {} for m in rows])


def harness_figures(metrics: list[dict[str, Any]]) -> HarnessFigures:
    """Sum the endpoint counters of rollouts' `metrics` (rollouts that made no call are not
    harness rollouts of this job's kind and count for nothing)."""
    out = HarnessFigures()
    reasons: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    p50s, maxes = [], []
    for m in metrics:
        if "calls" not in m:
            continue
        out.rollouts += 1
        for name in COUNTS:
            out.counts[name] += int(m.get(name) or 0)
        out.parse_failures += metric_count(m, "malformed_tool_calls")
        reasons.update(m.get("split_reasons") or {})
        errors.update(m.get("errors") or {})
        refusals.update(m.get("refusals") or {})
        if m.get("ttft_ms_p50") is not None:
            p50s.append(float(m["ttft_ms_p50"]))
        if m.get("ttft_ms_max") is not None:
            maxes.append(float(m["ttft_ms_max"]))
    out.split_reasons, out.errors, out.refusals = dict(reasons), dict(errors), dict(refusals)
    out.ttft_ms_p50 = round(statistics.median(p50s), 3) if p50s else None
    out.ttft_ms_max = max(maxes) if maxes else None
    return out
