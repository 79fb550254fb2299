"""Every write that moves a rollout, as one short conditional transaction.

A stage owns its rollout through a lease (`lease_owner`) taken by a conditional UPDATE; every
later write is fenced on that lease, so a worker that was presumed dead (and whose rollout was
handed to someone else) can no longer change it. The terminal write is `tasks.writes.terminal`;
cancelling a job is `tasks.writes.cancels`.
"""

from __future__ import annotations

import logging
from datetime import datetime
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from core import driver_statements
from core.db import get_engine, session_scope
from core.models import (
    TERMINAL_VALUES,
    Job,
    Rollout,
    Status,
    Turn,
    utcnow,
)
from tasks.writes import statements, turn_log
from tasks.writes.db_retry import retrying

log = logging.getLogger(__name__)


@retrying
def claim(db_url: str, rollout_id: str, attempt: int, stage: str, lease: str, node: str) -> tuple[Any, Job] | None:
    """Take the lease for `stage`; None when it is a duplicate or stale delivery.

    Returns the claimed row as a plain record (attribute access, writable: a stage notes its
    sandbox on it) and the job's snapshot. One prepared Core statement (`tasks.writes.statements`):
    the ORM's UPDATE ... RETURNING entity path cost a stage more CPU than the claim itself,
    and it runs on the driver's cursor (`core.driver_statements`).
    """
    now = utcnow()
    params = {
        "k_rid": rollout_id,
        "k_attempt": attempt,
        "k_queued": Status.PENDING.value if stage == "init" else stage,
        # RUN and EVAL claim only on the node the rollout is queued for: a stale message in
        # the queue of a node the rollout moved away from finds nothing (tasks.recovery.handback).
        "k_here": node,
        **statements.bound(
            {
                "status": stage,
                "lease_owner": lease,
                "heartbeat_at": now,
                "stage_started_at": now,
                "outbox_at": None,  # a claim also drops the outbox mark: the message got out
                "generating_on": None,
                "node": node,
            }
        ),
    }
    with get_engine(db_url).begin() as conn:
        row = driver_statements.execute(conn, statements.claim(stage == "init", node is None), params).first()
    if row is None:
        return None
    return SimpleNamespace(**row._mapping), job_snapshot(db_url, row.job_id)


@lru_cache(maxsize=4096)
@retrying
def _job_snapshot(db_url: str, job_id: str) -> Job:
    with session_scope(db_url) as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def job_snapshot(db_url: str, job_id: str) -> Job:
    """The job's immutable part (agent, config, sizes), cached per process.

    Only `cancel_requested`, `paused_at`/`pause_reason`, `finished_count` and `finished_at` ever
    change on a job; stage code reads cancel from the rollout row and pause only in the INIT
    claim's own statement, so a cached copy is safe and saves a query per stage.
    """
    return _job_snapshot(db_url, job_id)


@retrying
def save(db_url: str, rollout_id: str, lease: str, **values: Any) -> bool:
    """Write fields of a leased rollout; False when the lease was lost."""
    with session_scope(db_url) as s:
        result = s.connection().execute(
            update(Rollout).where(Rollout.id == rollout_id, Rollout.lease_owner == lease).values(**values)
        )
        return result.rowcount == 1


def advance(db_url: str, rollout_id: str, lease: str, to_stage: str, **values: Any) -> bool:
    """Hand a leased rollout to the next stage's queue (status set, lease released).

    The outbox mark is set in the same UPDATE: until `clear_mark` (after the publish) or the
    next claim drops it, the reaper's outbox drain knows the message may not be out.
    Refuses (False) when the lease was lost or a cancel arrived: the caller then checks
    `cancel_requested` and ends the rollout itself.
    """
    return hand_off(db_url, rollout_id, lease, to_stage, **values)[0]


@retrying
def hand_off(db_url: str, rollout_id: str, lease: str, to_stage: str, **values: Any) -> tuple[bool, datetime | None]:
    """`advance`, also returning the mark's time (what `tasks.writes.outbox_marks` fences its
    clear on); None when a retry found its own first commit landed (time not known)."""
    now = utcnow()
    values = {
        "status": to_stage,
        "lease_owner": None,
        "heartbeat_at": None,
        "queued_at": now,
        "stage_started_at": None,
        "outbox_at": now,
        **values,
    }
    with get_engine(db_url).begin() as conn:
        # A prepared Core statement (`tasks.writes.statements`): building the UPDATE anew cost more
        # CPU than executing it.
        params = {"k_rid": rollout_id, "k_lease": lease, **statements.bound(values)}
        if driver_statements.execute(conn, statements.hand_off(tuple(values)), params).rowcount == 1:
            return True, now
        # A retry whose first commit landed (`tasks.writes.db_retry`): only the lease holder moves a
        # rollout into `to_stage` unleased, so finding it there means the hand-off is done.
        return bool(conn.scalar(statements.handed_off(), {"k_rid": rollout_id, "k_queued": to_stage})), None


def clear_mark(db_url: str, rollout_id: str, attempt: int, queued_status: str) -> bool:
    """Drop the outbox mark of a rollout whose message was published (one statement).

    Fenced on the queued state it was published for, so a late clear never touches a mark a
    later hand-off of the same rollout set; a claim that came first has cleared it already.
    """
    params = {"k_rid": rollout_id, "k_attempt": attempt, "k_queued": queued_status}
    with get_engine(db_url).begin() as conn:
        return conn.execute(statements.clear_mark(), params).rowcount == 1


@retrying
def record_turn(
    db_url: str,
    rollout_id: str,
    attempt: int,
    lease: str | None = None,
    writes: turn_log.TurnLog | None = None,
    **fields: Any,
) -> None:
    """Append one turn to the log; returns once it is committed (`TurnLog.queue_turn` does not
    wait).

    With `lease`, fenced on it in the insert itself (`turn_log.write_turn`): a worker presumed
    dead, whose RUN was resumed by another, can never log a turn index twice; group-committed
    with the process's other turns when the process's turn log is given (`writes`), else in a
    transaction of its own. Without a lease (tools, tests), a plain insert. A turn already
    stored under its (rollout, attempt, index) is a retried insert whose first commit landed:
    not an error.
    """
    if lease is not None and writes is not None:
        writes.record_turn(rollout_id, attempt, lease, fields)
        return
    if lease is not None:
        with get_engine(db_url).begin() as conn:
            turn_log.write_turn(conn, rollout_id, attempt, lease, fields)
        return
    try:
        with session_scope(db_url) as s:
            s.connection().execute(Turn.__table__.insert().values(rollout_id=rollout_id, attempt=attempt, **fields))
    except IntegrityError:
        log.info("rollout %s: turn %s of attempt %s was already logged", rollout_id, fields.get("index"), attempt)


@retrying
def resume(
    db_url: str,
    rollout_id: str,
    *,
    stage: str = "run",
    from_turn: int | None = None,
    lease: str | None = None,
    expect_lease: str | None = None,
    error: str = "",
    **values: Any,
) -> bool:
    """Queue a lost RUN (or EVAL) again in the same attempt, keeping what it had stored.

    Fenced like `retry`: `lease` for the worker giving up its own lease, `expect_lease` for
    the reaper on the stale lease it observed. The attempt number does not change (its turns,
    workspace and sandbox label stay valid); the resume is appended to `resumes`. The outbox
    mark is set with it (see `advance`).
    """
    fence = lease if lease is not None else expect_lease
    with session_scope(db_url) as s:
        row = s.execute(
            select(Rollout.attempt, Rollout.resumes).where(
                Rollout.id == rollout_id, Rollout.lease_owner == fence, Rollout.status == stage
            )
        ).one_or_none()
        if row is None:
            return False
        entry = {
            "attempt": row.attempt,
            "stage": stage,
            "from_turn": from_turn,
            "error": error[:4000] or None,
            "at": utcnow().isoformat(),
        }
        return (
            s.execute(
                update(Rollout)
                .where(Rollout.id == rollout_id, Rollout.lease_owner == fence, Rollout.attempt == row.attempt)
                .values(
                    lease_owner=None,
                    heartbeat_at=None,
                    stage_started_at=None,
                    queued_at=utcnow(),
                    outbox_at=utcnow(),
                    resumes=[*(row.resumes or []), entry],
                    **values,
                )
            ).rowcount
            == 1
        )


def fenced(fence: dict[str, Any] | None) -> list[Any]:
    """Conditions `column == value` (None: IS NULL) for the row version a caller observed."""
    return [
        getattr(Rollout, name).is_(None) if value is None else getattr(Rollout, name) == value
        for name, value in (fence or {}).items()
    ]


@retrying
def retry(
    db_url: str,
    rollout_id: str,
    *,
    lease: str | None = None,
    expect_lease: str | None = None,
    error: str = "",
    fence: dict[str, Any] | None = None,
    note: dict[str, Any] | None = None,
) -> int | None:
    """Send a rollout back to INIT as a new attempt; returns the new attempt number.

    `lease` fences a stage worker giving up its own lease; `expect_lease` fences the reaper
    on the (stale) lease it observed; `fence` adds column values the caller observed (a
    queued row has no lease: its attempt, status and node say which version was judged).
    The ended attempt and its error are appended to `attempt_history` (the attempt number
    fences that read-modify-write too), with `note`'s keys (e.g. `replay: false`,
    `tasks.recovery.resume`). The outbox mark is set with it: a new attempt whose INIT message never
    got out is published by the drain.
    """
    owner = lease if lease is not None else expect_lease
    with session_scope(db_url) as s:
        row = s.execute(
            select(Rollout.attempt, Rollout.status, Rollout.attempt_history).where(Rollout.id == rollout_id)
        ).one_or_none()
        if row is None or row.status in TERMINAL_VALUES:
            return None
        cond = [Rollout.id == rollout_id, Rollout.attempt == row.attempt, *fenced(fence)]
        cond.append(Rollout.lease_owner == owner if owner is not None else Rollout.lease_owner.is_(None))
        result = s.execute(
            update(Rollout)
            .where(*cond)
            .values(
                status=Status.PENDING.value,
                attempt=row.attempt + 1,
                lease_owner=None,
                heartbeat_at=None,
                node=None,
                sandbox=None,
                llm_server=None,
                state={},
                stage_started_at=None,
                queued_at=utcnow(),
                outbox_at=utcnow(),
                error=error[:4000] or None,
                attempt_history=[
                    *(row.attempt_history or []),
                    {
                        "attempt": row.attempt,
                        "error": error[:4000] or None,
                        "ended_at": utcnow().isoformat(),
                        **(note or {}),
                    },
                ],
            )
        )
        return row.attempt + 1 if result.rowcount == 1 else None


@retrying
def cancel_requested(db_url: str, rollout_id: str) -> bool:
    """True once the rollout (or its job) was asked to stop."""
    with session_scope(db_url) as s:
        return bool(s.scalar(select(Rollout.cancel_requested).where(Rollout.id == rollout_id)))


def beat(db_url: str, leases: list[str]) -> set[str]:
    """Refresh the heartbeat of every lease this process holds; returns the leases whose
    rollout was asked to stop (read in the same statement)."""
    if not leases:
        return set()
    params = {"k_leases": leases, "k_held": leases, "v_heartbeat_at": utcnow()}
    with get_engine(db_url).begin() as conn:  # a prepared statement (`tasks.writes.statements.beat`)
        rows = conn.execute(statements.beat(), params).all()
    return {lease for lease, cancelled in rows if cancelled}


def seconds_since(start: datetime | None) -> float | None:
    """Elapsed seconds since a stored timestamp (SQLite returns naive UTC datetimes)."""
    if start is None:
        return None
    if start.tzinfo is None:
        from datetime import timezone

        start = start.replace(tzinfo=timezone.utc)
    return (utcnow() - start).total_seconds()
