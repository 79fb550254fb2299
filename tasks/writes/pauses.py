"""Pausing a job: its queued rollouts wait, unclaimed, until it resumes; nothing is lost.

A trainer or operator pauses a job (`POST /v1/jobs/{id}/pause`), or a critical health alert
does for a job that asks for it (`health.on_critical: pause`, `tasks.watch.health_alerts`):
a run that degrades (infra failures climbing, tool calls that stop parsing) stops spending
sandboxes and GPU time on rollouts that would train on noise, and resumes once fixed.

- **Queued rollouts wait.** The INIT claim refuses a rollout of a paused job
  (`tasks.writes.statements.claim`), so an INIT message met while paused is acked and the row
  stays queued for INIT without a message: parked. Pausing also removes the job's first-attempt
  INIT messages from the broker (`tasks.broker.purge`, as a cancel does) so other jobs do not
  queue behind them, and drops their outbox marks (the resume publishes every parked row).
- **Started rollouts finish.** A rollout past its INIT claim holds a sandbox; stopping it would
  throw its turns away or hold the sandbox for as long as the pause lasts. It runs to its end,
  as its group's other members that already started do.
- **Resume** clears the pause and marks every parked row for publication in one statement; the
  gateway's outbox publishes them (the reaper's outbox drain does, should the gateway die first).
  A message that was still in the broker is published twice: harmless, the second finds
  nothing to claim.

Cancel still works on a paused job and wins: it ends every queued rollout.
"""

from __future__ import annotations

import logging

from sqlalchemy import and_, update

from core.models import Job, Rollout, Status, utcnow
from core.db import session_scope

log = logging.getLogger(__name__)


def _parked(job_id: str):
    """The rows a pause keeps waiting: queued for INIT with no lease."""
    return and_(Rollout.job_id == job_id, Rollout.status == Status.PENDING.value, Rollout.lease_owner.is_(None))


def pause_job(db_url: str, job_id: str, reason: str) -> bool:
    """Pause a running job; False when it was already paused, finished or cancelled (the first
    pause's reason is kept)."""
    now = utcnow()
    with session_scope(db_url) as s:
        paused = s.execute(
            update(Job)
            .where(
                Job.id == job_id,
                Job.paused_at.is_(None),
                Job.finished_at.is_(None),
                Job.cancel_requested.is_(False),
            )
            .values(paused_at=now, pause_reason=reason[:2000]),
            execution_options={"synchronize_session": False},
        ).rowcount
        if paused:
            s.execute(
                update(Rollout).where(_parked(job_id), Rollout.outbox_at.is_not(None)).values(outbox_at=None),
                execution_options={"synchronize_session": False},
            )
    if paused:
        log.warning("job %s paused: %s", job_id, reason)
    return bool(paused)


def resume_job(db_url: str, job_id: str) -> list[str]:
    """Resume a paused job; the ids of its parked rollouts, marked for publication (empty
    when it was not paused)."""
    now = utcnow()
    with session_scope(db_url) as s:
        resumed = s.execute(
            update(Job).where(Job.id == job_id, Job.paused_at.is_not(None)).values(paused_at=None, pause_reason=None),
            execution_options={"synchronize_session": False},
        ).rowcount
        if not resumed:
            return []
        ids = list(
            s.scalars(
                update(Rollout)
                .where(_parked(job_id), Rollout.cancel_requested.is_(False))
                .values(outbox_at=now, queued_at=now)
                .returning(Rollout.id),
                execution_options={"synchronize_session": False},
            )
        )
    log.warning("job %s resumed: %s queued rollouts published again", job_id, len(ids))
    return ids
