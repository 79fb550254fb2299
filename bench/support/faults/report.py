"""What one faulted job cost (`Report`): the figures the fault campaign and the partition tier
measure, and the problems that make a job not clean."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any
from raas_client.models import JobAccepted


@dataclass
class Report:
    """What one faulted job cost. Every `*_lost`, `duplicated`, `*_left`, `wrong_*` and
    `missing_*` figure must be 0 (or empty); `regenerated_calls` and `rerun_rollouts` are
    the waste the issue wants down to (near) 0."""

    fault: str
    rollouts: int
    seconds: float = 0.0
    finished: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    lost: int = 0  # rollouts never terminal
    unexpected_outcomes: int = 0  # e.g. infra_error where every rollout should complete
    duplicated: int = 0  # results beyond one per rollout
    seq_gaps: list[int] = field(default_factory=list)  # missing places in the result order
    repeated_turns: int = 0  # rollouts whose trajectory repeats or skips a turn index
    wrong_rewards: int = 0  # completed with a reward other than the scripted one
    missing_tokens: int = 0  # completed without prompt/response ids or loss mask
    live_sandboxes_left: int = 0
    dirs_left: int = 0  # workspaces and sandbox state entries of the job
    llm_calls: int = 0  # generation requests the job sent (started)
    regenerated_calls: int = 0  # llm_calls beyond 4 per rollout that ran its loop
    rerun_rollouts: int = 0  # rollouts whose first turn was generated more than once
    retried_rollouts: int = 0  # rollouts that ended on an attempt > 1
    affected: int = 0  # rollouts the fault hit (e.g. in RUN on a killed pool)
    affected_regenerated: int = 0  # answered turns beyond 4 of the affected rollouts
    affected_regenerated_max: int = 0  # the most any one affected rollout regenerated (goal <= 1)
    replayed_turns: int = 0  # logged turns replayed into a rebuilt sandbox (metrics.replayed_turns)
    regenerated_tokens: int = (
        0  # tokens of logged turns generated again, as the service counts them (app.recovery_costs)
    )
    replay_divergences: int = 0  # replayed calls whose output differed from the log
    pools_exited: int = 0  # pools that ended by themselves (dead at the end or restarted)
    violations: int = 0  # history checks that failed (bench/support/partitions/checker.py), named in notes
    job_ids: list[str] = field(default_factory=list)  # the scripted jobs measured here
    side_jobs: list[JobAccepted] = field(default_factory=list)  # other jobs: the fault's `after` judges them
    notes: list[str] = field(default_factory=list)
    affected_ids: set[str] = field(default_factory=set, repr=False)  # set by the fault
    extra_jobs: list[JobAccepted] = field(default_factory=list, repr=False)  # ditto

    def problems(self) -> list[str]:
        """Why the job was not clean: lost, duplicated, leaked or fake work."""
        names = (
            "lost",
            "unexpected_outcomes",
            "duplicated",
            "repeated_turns",
            "wrong_rewards",
            "missing_tokens",
            "live_sandboxes_left",
            "dirs_left",
            "violations",
        )
        out = [f"{n}={getattr(self, n)}" for n in names if getattr(self, n)]
        if self.seq_gaps:
            out.append(f"seq_gaps={self.seq_gaps}")
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figures."""
        out = asdict(self)
        del out["affected_ids"], out["extra_jobs"], out["side_jobs"]
        return out
