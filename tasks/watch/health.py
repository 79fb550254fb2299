"""A job's live health, computed on read from its finished rollouts (never on the hot path).

Every figure comes from what the terminal write already stores on the rollout: the agent
loop's counters in `metrics` (turns, tool_calls, malformed_tool_calls, time_split,
retokenization_drift), `finish_reason`, `outcome`, `reward`, the stage seconds and the
policy versions. Nothing is added to the terminal write (BENCHMARKS.md: it bounds throughput).

`HealthCache` keeps, per job, one compact `Sample` per finished rollout and the job's result
cursor (`result_seq`, indexed): a read fetches only the rollouts finished since the last one,
so the gateway's page, API and /metrics, and the reaper's alert pass, each cost one indexed
range scan of new rows. The figures themselves are recomputed from the samples (pure Python
over at most the job's size).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Any

from raas_client.health_models import GroupHealth, HealthFigures
from raas_client.models import failure_class_of
from sqlalchemy import select
from sqlalchemy.orm import Session

from agents.finish_reasons import CUT_TURN
from core.models import Rollout

CUT_AT_LIMIT = CUT_TURN | {"length"}  # a reply cut at the token limit (vLLM's finish `length`)
SERIES = ("turns_mean", "parse_failure_rate", "reward_without_tools", "truncation_rate", "infra_rate", "reward_mean")
MAX_POINTS = 40


@dataclass(frozen=True)
class Sample:
    """What health needs of one finished rollout."""

    seq: int
    instance_id: str
    failure_class: str | None
    outcome: str | None
    reward: float | None
    turns: int | None
    tool_calls: int
    malformed: int
    truncated: bool
    drift: bool
    weight_version: str | None
    seconds: dict[str, float]


# `metrics.time_split` (`agents.time_split`: whose time the RUN spent) -> health's keys
SPLIT_KEYS = {
    "generation": "gen",
    "tools": "tool",
    "harness": "harness",
    "waiting": "waiting",
    "paused": "paused",
    "other": "other",
}


def _time_split(metrics: dict[str, Any]) -> dict[str, float]:
    """Seconds of the RUN by kind: the loop's `time_split` when recorded, else its counters."""
    split = metrics.get("time_split")
    if isinstance(split, dict):
        return {ours: float(split[theirs]) for theirs, ours in SPLIT_KEYS.items() if split.get(theirs) is not None}
    return {k: float(metrics[f"{k}_seconds"]) for k in ("gen", "tool", "paused") if f"{k}_seconds" in metrics}


def sample_of(row: Any) -> Sample:
    """A `Sample` of a selected rollout row (see `COLUMNS`)."""
    metrics = row.metrics or {}
    versions = [v for v in (row.policy_versions or []) if v is not None]
    seconds = _time_split(metrics)
    for stage in ("init", "run", "eval"):
        value = getattr(row, f"{stage}_seconds")
        if value is not None:
            seconds[stage] = float(value)
    return Sample(
        seq=int(row.result_seq),
        instance_id=row.instance_id,
        failure_class=failure_class_of(row.outcome),
        outcome=row.outcome,
        reward=row.reward,
        turns=metrics.get("turns"),
        tool_calls=int(metrics.get("tool_calls") or 0),
        malformed=int(metrics.get("malformed_tool_calls") or 0),
        truncated=row.finish_reason in CUT_AT_LIMIT,
        drift=bool(metrics.get("retokenization_drift")),
        weight_version=None if not versions else str(versions[-1]),
        seconds=seconds,
    )


COLUMNS = (
    Rollout.result_seq,
    Rollout.instance_id,
    Rollout.outcome,
    Rollout.reward,
    Rollout.finish_reason,
    Rollout.metrics,
    Rollout.policy_versions,
    Rollout.init_seconds,
    Rollout.run_seconds,
    Rollout.eval_seconds,
)


def samples_after(s: Session, job_id: str, after: int) -> list[Sample]:
    """The job's rollouts finished after cursor `after`, in completion order."""
    rows = s.execute(
        select(*COLUMNS).where(Rollout.job_id == job_id, Rollout.result_seq > after).order_by(Rollout.result_seq)
    )
    return [sample_of(r) for r in rows]


class HealthCache:
    """Per-job samples read incrementally; the `jobs` most recently read are kept."""

    def __init__(self, jobs: int = 64) -> None:
        self._jobs: OrderedDict[str, list[Sample]] = OrderedDict()
        self._size = jobs
        self.judged: dict[str, int] = {}  # job id -> last seq the alert pass judged (tasks.watch.health_alerts)
        self._lock = threading.Lock()

    def samples(self, s: Session, job_id: str) -> list[Sample]:
        """Every finished rollout of the job, the new ones read since the last call."""
        with self._lock:
            known = list(self._jobs.get(job_id, []))
        fresh = samples_after(s, job_id, known[-1].seq if known else 0)
        known.extend(fresh)
        with self._lock:
            self._jobs[job_id] = known
            self._jobs.move_to_end(job_id)
            while len(self._jobs) > self._size:
                self.judged.pop(self._jobs.popitem(last=False)[0], None)
        return known


def _share(hits: int, total: int) -> float | None:
    return None if total == 0 else round(hits / total, 4)


def _mean(values: list[float]) -> float | None:
    return None if not values else sum(values) / len(values)


def _var(values: list[float]) -> float | None:
    m = _mean(values)
    return None if m is None else sum((v - m) ** 2 for v in values) / len(values)


def _quantile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def group_rewards(samples: list[Sample]) -> list[GroupHealth]:
    """Reward mean and variance per group (instance), over the samples with a reward."""
    by_group: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        if sample.reward is not None and sample.failure_class != "infra":
            by_group[sample.instance_id].append(sample.reward)
    return [
        GroupHealth(instance_id=i, n=len(r), mean=_round(_mean(r)), var=_round(_var(r))) for i, r in by_group.items()
    ]


def figures(samples: list[Sample]) -> HealthFigures:
    """The health figures over `samples` (see `raas_client.health_models`)."""
    looped = [x for x in samples if x.turns is not None]
    turns = [int(x.turns) for x in looped]
    attempted = sum(x.tool_calls + x.malformed for x in looped)
    rewarded = [x for x in looped if (x.reward or 0) > 0]
    rewards = [x.reward for x in samples if x.reward is not None and x.failure_class != "infra"]
    groups = [g for g in group_rewards(samples) if g.n >= 2]
    hist: dict[str, int] = defaultdict(int)
    for t in turns:
        hist["10+" if t >= 10 else str(t)] += 1
    split: dict[str, list[float]] = defaultdict(list)
    for x in samples:
        for k, v in x.seconds.items():
            split[k].append(v)
    return HealthFigures(
        rollouts=len(samples),
        turns_mean=_round(_mean(turns)),
        turns_p50=_quantile(turns, 0.5),
        turns_p90=_quantile(turns, 0.9),
        turns_hist=dict(sorted(hist.items(), key=lambda kv: (len(kv[0]), kv[0]))),
        tool_calls_mean=_round(_mean([x.tool_calls for x in looped])),
        parse_failure_rate=_share(sum(x.malformed for x in looped), attempted) if looped else None,
        truncation_rate=_share(sum(x.truncated for x in samples), len(samples)),
        zero_tool_rollouts=_share(sum(x.tool_calls == 0 for x in looped), len(looped)),
        reward_without_tools=_share(sum(x.tool_calls == 0 for x in rewarded), len(rewarded)) if looped else None,
        drift_rate=_share(sum(x.drift for x in looped), len(looped)),
        infra_rate=_share(sum(x.failure_class == "infra" for x in samples), len(samples)),
        timeout_rate=_share(sum(x.outcome == "timeout" for x in samples), len(samples)),
        reward_mean=_round(_mean(rewards)),
        reward_var=_round(_var(rewards)),
        group_reward_var_mean=_round(_mean([g.var for g in groups if g.var is not None])),
        zero_variance_groups=_share(sum(g.var == 0 for g in groups), len(groups)),
        time_split={k: round(sum(v) / len(v), 4) for k, v in sorted(split.items())},
    )


def by_weight_version(samples: list[Sample]) -> dict[str, HealthFigures]:
    """Figures per weight version (the newest version a rollout's turns ran on)."""
    grouped: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        grouped[sample.weight_version or "unknown"].append(sample)
    return {version: figures(group) for version, group in grouped.items()}


def series(samples: list[Sample], window: int) -> tuple[int, dict[str, list[float | None]]]:
    """(bucket, {figure: values}) for the sparklines: at the end of every bucket of `bucket`
    rollouts, the figure over the `window` rollouts ending there (what alerts judge)."""
    bucket = max(1, math.ceil(len(samples) / MAX_POINTS))
    ends = [min(len(samples), i + bucket) for i in range(0, len(samples), bucket)]
    points = [figures(samples[max(0, end - window) : end]) for end in ends]
    return bucket, {name: [getattr(p, name) for p in points] for name in SERIES}
