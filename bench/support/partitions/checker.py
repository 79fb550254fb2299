"""The partition checker: one pass over a job's complete history, after it ended.

A partition is where lease-and-fence designs break: a node cut off from PostgreSQL keeps its
sandboxes and LLM calls going, another node's reaper gives its rollouts to someone else, and
when the link heals the first node's held statements arrive late. The campaign already counts
lost, duplicated, wrongly rewarded and leaked work (`bench/support/faults/campaign.py`); this adds
what only the history shows, from PostgreSQL's commit timestamps
(`track_commit_timestamp`, on in `bench.support.private_services`):

- no turn of an attempt committed after that attempt was ended (`attempt_history.ended_at`):
  a write fenced on a lease that had been taken away must be refused;
- no turn of an in-place resume's attempt below its `from_turn` committed after the resume
  (the resumed RUN rebuilt its session from the turns stored then: a late one would be a
  turn the trajectory does not contain);
- no turn of any attempt committed after the rollout's terminal write;
- per attempt, turn indexes are 0..k-1 without gaps (a gap is a turn lost in a batch).

`SLACK` forgives the clock between the statement that read `now` and its commit (the ended
attempt's time is taken just before its UPDATE; a fenced insert that committed first, a few
milliseconds before, is legitimate). A partitioned node's late write lands seconds late.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from core.db import session_scope
from bench.support.faults.campaign import Campaign, Report

SLACK = timedelta(seconds=1.0)

_TURNS = sa.text(
    "SELECT t.rollout_id, t.attempt, t.index, pg_xact_commit_timestamp(t.xmin) AS committed "
    "FROM turns t JOIN rollouts r ON r.id = t.rollout_id WHERE r.job_id = :job"
)
_ROLLOUTS = sa.text(
    "SELECT id, attempt, attempt_history, resumes, finished_at, "
    "pg_xact_commit_timestamp(xmin) AS last_write FROM rollouts WHERE job_id = :job"
)


def check_history(c: Campaign, job_id: str, report: Report) -> list[str]:
    """Violations in `job_id`'s history (also counted on `report` and named in its notes)."""
    with session_scope(c.db) as s:
        turns = s.execute(_TURNS, {"job": job_id}).all()
        rollouts = {r.id: r for r in s.execute(_ROLLOUTS, {"job": job_id}).all()}
    by_attempt: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for t in turns:
        by_attempt[t.rollout_id, t.attempt].append(t)
    found: list[str] = []
    for (rid, attempt), rows in by_attempt.items():
        found += _late_turns(rollouts[rid], attempt, rows)
        indexes = sorted(t.index for t in rows)
        if indexes != list(range(len(indexes))):
            found.append(f"{rid} attempt {attempt}: turn indexes {indexes}")
    report.violations += len(found)
    report.notes += found[:20]
    return found


def _late_turns(rollout: Any, attempt: int, rows: list[Any]) -> list[str]:
    """Turns of `attempt` committed after a fence had moved on (see the module doc)."""
    found = []
    ended = [_at(h["ended_at"]) for h in rollout.attempt_history or [] if h.get("attempt") == attempt]
    for t in rows:
        if t.committed is None:  # committed before the server tracked commit times
            continue
        if ended and t.committed > ended[0] + SLACK:
            found.append(f"{rollout.id} attempt {attempt}: turn {t.index} committed {_after(t, ended[0])} its end")
        if rollout.finished_at is not None and t.committed > rollout.finished_at + SLACK:
            found.append(f"{rollout.id}: turn {t.index} committed {_after(t, rollout.finished_at)} the rollout ended")
        for entry in rollout.resumes or []:
            if entry.get("attempt") != attempt or entry.get("from_turn") is None or entry.get("stage") != "run":
                continue
            if t.index < entry["from_turn"] and t.committed > _at(entry["at"]) + SLACK:
                found.append(
                    f"{rollout.id} attempt {attempt}: turn {t.index} < from_turn {entry['from_turn']} "
                    f"committed {_after(t, _at(entry['at']))} the resume"
                )
    return found


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _after(turn: Any, moment: datetime) -> str:
    return f"{(turn.committed - moment).total_seconds():.1f}s after"
