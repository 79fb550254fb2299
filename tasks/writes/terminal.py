"""A rollout's terminal write: its status, outcome and place in the job's completion order.

Terminal writes allocate the rollout's completion sequence number under the job's row lock
(and, for straggler-cut jobs, the group's lock first), which gives the results cursor a
gapless, commit-ordered sequence. Split from `tasks.writes.lifecycle`, whose fenced writes move a
rollout between stages; this one ends it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from core import driver_statements
from core.db import get_engine
from core.models import Job, Rollout, Status, utcnow
from tasks.writes import callbacks, groups, statements
from tasks.writes.db_retry import retrying

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
    now = utcnow()
    values = {
        "status": status.value,
        "outcome": outcome,
        "lease_owner": None,
        "heartbeat_at": None,
        "finished_at": now,
        **values,
    }
    fence = fence or {}
    # Prepared statements (`tasks.writes.statements`): cached per fence shape and set of columns, run
    # on the driver's cursor (`core.driver_statements`).
    ending = statements.finish(
        status.value,
        lease is not None,
        tuple(expect_status) if expect_status is not None else None,
        tuple((name, value is None) for name, value in fence.items()),
        tuple(values),
    )
    params = {
        "k_rid": rollout_id,
        "k_lease": lease,
        **{f"f_{name}": value for name, value in fence.items() if value is not None},
        **statements.bound(values),
    }
    with _transaction(db_url) as (conn, orm):
        if group is None or group.group_size is not None:
            _lock_group(orm(), rollout_id)
        row = driver_statements.execute(conn, ending, params).first()
        if row is None:
            return False
        _complete(conn, orm, rollout_id, row, now)
        return True


@contextmanager
def _transaction(db_url: str) -> Iterator[tuple[Connection, Callable[[], Session]]]:
    """One transaction on a Core connection, and an ORM session on it made only when asked
    (a straggler-cut group or a callback needs one; a plain ending does not pay for it)."""
    sessions: list[Session] = []

    def orm() -> Session:
        if not sessions:
            sessions.append(Session(bind=conn))  # joins the connection's transaction
        return sessions[0]

    with get_engine(db_url).begin() as conn:
        try:
            yield conn, orm
            for session in sessions:
                session.flush()  # its ORM changes (a group's members) commit with the connection
        finally:
            for session in sessions:
                session.close()


def _complete(conn: Connection, orm: Callable[[], Session], rollout_id: str, row: Any, now: Any) -> None:
    """The ended rollout's place in its job: completion number, group and job completion,
    callbacks (same transaction as the ending)."""
    job = driver_statements.execute(conn, statements.count_finished(), {"k_job_id": row.job_id}).first()
    seq, ended = job.finished_count, 0
    if job.group_size is not None:  # a straggler cut decides (tasks.writes.groups)
        group_done, ended = groups.on_finish(
            orm(), row.job_id, row.instance_id, rollout_id, row.outcome, row.reward, row.cut_reason
        )
    else:
        group_done = (
            job.n_samples == 1
            or not driver_statements.execute(
                conn, statements.group_unfinished(), {"k_job_id": row.job_id, "k_instance_id": row.instance_id}
            ).first()[0]
        )
    driver_statements.execute(
        conn, statements.place_in_order(), {"k_rid": rollout_id, "k_seq": seq, "v_completes_group": group_done}
    )
    job_done = seq + ended >= job.total
    if job_done:
        driver_statements.execute(conn, statements.job_finished(), {"k_job_id": row.job_id, "k_now": now})
    if job.callback_url and (group_done or job_done):
        s = orm()
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
