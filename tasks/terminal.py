"""A rollout's terminal write: its status, outcome and place in the job's completion order.

Terminal writes allocate the rollout's completion sequence number under the job's row lock
(and, for straggler-cut jobs, the group's lock first), which gives the results cursor a
gapless, commit-ordered sequence. Split from `tasks.lifecycle`, whose fenced writes move a
rollout between stages; this one ends it.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import and_, func, select, update

from core.db import session_scope
from core.models import TERMINAL_VALUES, Job, Rollout, Status, sources_of, utcnow
from tasks import callbacks, groups
from tasks.db_retry import retrying
from tasks.lifecycle import fenced

log = logging.getLogger(__name__)


@retrying
def finish(
    db_url: str,
    rollout_id: str,
    status: Status,
    outcome: str,
    *,
    lease: str | None = None,
    expect_status: list[str] | None = None,
    fence: dict[str, Any] | None = None,
    group: Any = None,
    **values: Any,
) -> bool:
    """Move a rollout to a terminal status and give it the next completion sequence number.

    Fenced on `lease` when given (stage workers), else on `expect_status` (reaper, cancel);
    `fence` adds column values the caller observed (`fenced`), so two reapers acting on the
    same observation end a row once. `group` is the caller's job snapshot (a stage has it):
    its `group_size` (immutable) spares the read that decides whether to take the group lock.
    The job counter is bumped in the same transaction (the row lock orders completions), so
    the results cursor never skips a rollout that commits late.
    """
    if status == Status.DONE:
        values.setdefault("error", None)  # an earlier attempt's error stays in attempt_history
    cond = [Rollout.id == rollout_id, Rollout.status.in_(sources_of(status))]
    if lease is not None:
        cond.append(Rollout.lease_owner == lease)
    if expect_status is not None:
        cond.append(Rollout.status.in_(expect_status))
    cond.extend(fenced(fence))
    now = utcnow()
    with session_scope(db_url) as s:
        if group is None or group.group_size is not None:
            _lock_group(s, rollout_id)
        conn = s.connection()  # Core statements (see `hand_off`)
        row = conn.execute(
            update(Rollout)
            .where(and_(*cond))
            .values(
                status=status.value, outcome=outcome, lease_owner=None, heartbeat_at=None, finished_at=now, **values
            )
            .returning(Rollout.job_id, Rollout.instance_id, Rollout.outcome, Rollout.reward, Rollout.cut_reason)
        ).one_or_none()
        if row is None:
            return False
        job = conn.execute(
            update(Job)
            .where(Job.id == row.job_id)
            .values(finished_count=Job.finished_count + 1)
            .returning(
                Job.finished_count,
                (Job.n_instances * Job.n_samples).label("total"),
                Job.n_samples,
                Job.group_size,
                Job.callback_url,
                Job.owner,
            )
        ).one()
        seq, ended = job.finished_count, 0
        if job.group_size is not None:  # a straggler cut decides (tasks.groups)
            group_done, ended = groups.on_finish(
                s, row.job_id, row.instance_id, rollout_id, row.outcome, row.reward, row.cut_reason
            )
        else:
            group_done = job.n_samples == 1 or not s.scalar(
                select(func.count())
                .select_from(Rollout)
                .where(
                    Rollout.job_id == row.job_id,
                    Rollout.instance_id == row.instance_id,
                    Rollout.status.not_in(TERMINAL_VALUES),
                )
            )
        conn.execute(update(Rollout).where(Rollout.id == rollout_id).values(result_seq=seq, completes_group=group_done))
        job_done = seq + ended >= job.total
        if job_done:
            conn.execute(update(Job).where(Job.id == row.job_id).values(finished_at=now))
        if job.callback_url and (group_done or job_done):
            callbacks.on_completions(
                s,
                row.job_id,
                job.owner,
                job.callback_url,
                job_done=job_done,
                group=groups.payload(s, row.job_id, row.instance_id, rollout_id, seq, job.group_size)
                if group_done
                else None,
            )
        return True


def _lock_group(s: Any, rollout_id: str) -> None:
    """A straggler-cut job's endings of one group take the group's lock first: one of them
    may cut the others, and rows locked in differing orders would deadlock."""
    # Read in this transaction, never through job_snapshot's own session: on SQLite a second
    # connection's BEGIN IMMEDIATE waits for this one's and the ending deadlocks.
    key = s.execute(
        select(Rollout.job_id, Rollout.instance_id, Job.group_size)
        .join(Job, Job.id == Rollout.job_id)
        .where(Rollout.id == rollout_id)
    ).one_or_none()
    if key is not None and key.group_size is not None:
        groups.lock(s, key.job_id, key.instance_id)
