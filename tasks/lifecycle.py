"""Every write that moves a rollout, as one short conditional transaction.

A stage owns its rollout through a lease (`lease_owner`) taken by a conditional UPDATE; every
later write is fenced on that lease, so a worker that was presumed dead (and whose rollout was
handed to someone else) can no longer change it. Terminal writes also allocate the rollout's
place in the job's completion order under the job's row lock, which gives the results cursor a
gapless, commit-ordered sequence.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import and_, case, exists, func, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import aliased

from core.db import session_scope
from core.models import (
    ACTIVE,
    TERMINAL_VALUES,
    Job,
    Outcome,
    Rollout,
    Status,
    Turn,
    sources_of,
    utcnow,
)
from tasks import callbacks, groups, turn_log
from tasks.db_retry import retrying

log = logging.getLogger(__name__)


@retrying
def claim(db_url: str, rollout_id: str, attempt: int, stage: str, lease: str, node: str) -> tuple[Rollout, Job] | None:
    """Take the lease for `stage`; None when it is a duplicate or stale delivery."""
    queued_status = Status.PENDING.value if stage == "init" else stage
    now = utcnow()
    # A claim also drops the outbox mark: the message evidently got out.
    values: dict[str, Any] = {
        "status": stage,
        "lease_owner": lease,
        "heartbeat_at": now,
        "stage_started_at": now,
        "outbox_at": None,
        "generating_on": None,
        "paused_seconds": 0.0,
    }
    if stage == "init":
        values["node"] = node
    # RUN and EVAL claim only on the node the rollout is queued for: a stale message in the
    # queue of a node the rollout moved away from finds nothing (tasks.handback).
    here = [] if stage == "init" else [Rollout.node == node]
    with session_scope(db_url) as s:
        rollout = s.scalars(
            update(Rollout)
            .where(
                Rollout.id == rollout_id,
                Rollout.attempt == attempt,
                Rollout.status == queued_status,
                Rollout.lease_owner.is_(None),
                *here,
            )
            .values(**values)
            .returning(Rollout),
            execution_options={"synchronize_session": False},
        ).one_or_none()
        if rollout is None:
            return None
        s.expunge(rollout)
    return rollout, job_snapshot(db_url, rollout.job_id)


@lru_cache(maxsize=4096)
@retrying
def _job_snapshot(db_url: str, job_id: str) -> Job:
    with session_scope(db_url) as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def job_snapshot(db_url: str, job_id: str) -> Job:
    """The job's immutable part (agent, config, sizes), cached per process.

    Only `cancel_requested`, `finished_count` and `finished_at` ever change on a job, and stage
    code reads cancel from the rollout row, so a cached copy is safe and saves a query per stage.
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
    """`advance`, also returning the mark's time (what `tasks.outbox_marks` fences its
    clear on); None when a retry found its own first commit landed (time not known)."""
    now = utcnow()
    with session_scope(db_url) as s:
        # Core statements on the session's connection: the ORM's bulk-UPDATE path costs more
        # CPU than the statement itself here, and nothing below needs the identity map.
        if (
            s.connection()
            .execute(
                update(Rollout)
                .where(Rollout.id == rollout_id, Rollout.lease_owner == lease, Rollout.cancel_requested.is_(False))
                .values(
                    status=to_stage,
                    lease_owner=None,
                    heartbeat_at=None,
                    queued_at=now,
                    stage_started_at=None,
                    outbox_at=now,
                    **values,
                )
            )
            .rowcount
            == 1
        ):
            return True, now
        # A retry whose first commit landed (`tasks.db_retry`): only the lease holder moves a
        # rollout into `to_stage` unleased, so finding it there means the hand-off is done.
        return bool(
            s.scalar(
                select(func.count())
                .select_from(Rollout)
                .where(Rollout.id == rollout_id, Rollout.status == to_stage, Rollout.lease_owner.is_(None))
            )
        ), None


def clear_mark(db_url: str, rollout_id: str, attempt: int, queued_status: str) -> bool:
    """Drop the outbox mark of a rollout whose message was published (one statement).

    Fenced on the queued state it was published for, so a late clear never touches a mark a
    later hand-off of the same rollout set; a claim that came first has cleared it already.
    """
    with session_scope(db_url) as s:
        return (
            s.connection()
            .execute(
                update(Rollout)
                .where(
                    Rollout.id == rollout_id,
                    Rollout.attempt == attempt,
                    Rollout.status == queued_status,
                    Rollout.lease_owner.is_(None),
                    Rollout.outbox_at.is_not(None),
                )
                .values(outbox_at=None),
                execution_options={"synchronize_session": False},
            )
            .rowcount
            == 1
        )


@retrying
def record_turn(
    db_url: str,
    rollout_id: str,
    attempt: int,
    lease: str | None = None,
    window: float = turn_log.DEFAULT_WINDOW,
    **fields: Any,
) -> None:
    """Append one turn to the log; returns once it is committed (before the agent's next
    generation).

    With `lease`, fenced on it in the insert itself and group-committed with the process's
    other turns (`tasks.turn_log`): a worker presumed dead, whose RUN was resumed by another,
    can never log a turn index twice. Without (tools, tests), a plain insert of its own. A
    turn already stored under its (rollout, attempt, index) is a retried insert whose first
    commit landed: not an error.
    """
    if lease is not None:
        turn_log.writer(db_url, window).record_turn(rollout_id, attempt, lease, fields)
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


@retrying
def retry(
    db_url: str,
    rollout_id: str,
    *,
    lease: str | None = None,
    expect_lease: str | None = None,
    error: str = "",
    fence: dict[str, Any] | None = None,
) -> int | None:
    """Send a rollout back to INIT as a new attempt; returns the new attempt number.

    `lease` fences a stage worker giving up its own lease; `expect_lease` fences the reaper
    on the (stale) lease it observed; `fence` adds column values the caller observed (a
    queued row has no lease: its attempt, status and node say which version was judged).
    The ended attempt and its error are appended to `attempt_history` (the attempt number
    fences that read-modify-write too). The outbox mark is set with it: a new attempt whose
    INIT message never got out is published by the drain.
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
                    {"attempt": row.attempt, "error": error[:4000] or None, "ended_at": utcnow().isoformat()},
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
    # Rows locked in id order (FOR UPDATE in the subquery; SQLite serialises writers), the
    # order the turn writer takes them in: a beat and a batch of turns never deadlock.
    mine = select(Rollout.id).where(Rollout.lease_owner.in_(leases)).order_by(Rollout.id).with_for_update()
    with session_scope(db_url) as s:
        rows = s.execute(
            update(Rollout)
            .where(Rollout.id.in_(mine.scalar_subquery()), Rollout.lease_owner.in_(leases))
            .values(heartbeat_at=utcnow())
            .returning(Rollout.lease_owner, Rollout.cancel_requested)
        ).all()
    return {lease for lease, cancelled in rows if cancelled}


def seconds_since(start: datetime | None) -> float | None:
    """Elapsed seconds since a stored timestamp (SQLite returns naive UTC datetimes)."""
    if start is None:
        return None
    if start.tzinfo is None:
        from datetime import timezone

        start = start.replace(tzinfo=timezone.utc)
    return (utcnow() - start).total_seconds()


_cancelled_jobs: OrderedDict[str, None] = OrderedDict()  # most recent last, bounded
_cancelled_lock = threading.Lock()
CANCELLED_JOBS_KEPT = 4096


def known_cancelled(job_id: str) -> bool:
    """True when this process saw that the job was cancelled (memory only, no query).

    Lets an INIT worker drop the stale first-attempt messages of a cancelled job without a
    database write each: after the cancel's commit no first attempt of that job can be
    claimed (the cancel ended every queued one; a retry is attempt 2 or later and is claimed
    as usual, then ends as cancelled when it sees the flag).
    """
    with _cancelled_lock:
        return job_id in _cancelled_jobs


def note_if_cancelled(db_url: str, job_id: str) -> bool:
    """Read whether the job was cancelled and remember it if so (cancel is permanent)."""
    with session_scope(db_url) as s:
        cancelled = bool(s.scalar(select(Job.cancel_requested).where(Job.id == job_id)))
    if cancelled:
        with _cancelled_lock:
            _cancelled_jobs[job_id] = None
            while len(_cancelled_jobs) > CANCELLED_JOBS_KEPT:
                _cancelled_jobs.popitem(last=False)
    return cancelled


def cancel_job(db_url: str, job_id: str, attempts: int = 3) -> int:
    """Cancel a job as set operations; returns how many queued rollouts it ended.

    Every unfinished rollout gets `cancel_requested` (running ones stop at their next turn,
    rollouts queued for RUN/EVAL end when their worker claims them and releases the sandbox).
    Rollouts queued for INIT (never started: no sandbox) end here, all in one UPDATE, with the
    next completion sequence numbers in (instance, sample) order and `completes_group` on the
    last one of each group that nothing else keeps open; the job's counter moves once. Their
    queued messages then find nothing to claim. Retried on a database deadlock: the statement
    locks many rows at once, and a heartbeat may hold some of them in another order.
    """
    for attempt in range(1, attempts + 1):
        try:
            return _cancel_job_once(db_url, job_id)
        except DBAPIError as exc:
            if attempt == attempts or getattr(exc.orig, "sqlstate", None) != "40P01":
                raise
            log.warning("job %s: cancel hit a deadlock, retrying (%s)", job_id, attempt)
    raise AssertionError("unreachable")


def _cancel_job_once(db_url: str, job_id: str) -> int:
    now = utcnow()
    queued = and_(Rollout.job_id == job_id, Rollout.status == Status.PENDING.value, Rollout.lease_owner.is_(None))
    plain = {"synchronize_session": False}
    with session_scope(db_url) as s:
        # Rows first, then the job: the order `finish` locks them in (no deadlock with it),
        # and holding the queued rows keeps claims out until the numbers below are final.
        s.execute(
            update(Rollout)
            .where(Rollout.job_id == job_id, Rollout.status.not_in(TERMINAL_VALUES))
            .values(cancel_requested=True),
            execution_options=plain,
        )
        base, total = s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(cancel_requested=True)
            .returning(Job.finished_count, Job.n_instances * Job.n_samples),
            execution_options=plain,
        ).one()
        other = aliased(Rollout)
        ranked = (
            select(
                Rollout.id,
                func.row_number().over(order_by=(Rollout.instance_id, Rollout.sample_index)).label("rn"),
                func.row_number()
                .over(partition_by=Rollout.instance_id, order_by=Rollout.sample_index.desc())
                .label("from_end"),
                # a started sibling still open: it (not us) will complete the group
                exists()
                .where(
                    other.job_id == job_id,
                    other.instance_id == Rollout.instance_id,
                    other.status.in_([s.value for s in ACTIVE]),
                )
                .label("busy"),
            )
            .where(queued)
            .subquery()
        )
        n = s.execute(
            update(Rollout)
            .where(Rollout.id == ranked.c.id)
            .values(
                status=Status.CANCELLED.value,
                outcome=Outcome.CANCELLED.value,
                error="cancelled",
                lease_owner=None,
                heartbeat_at=None,
                finished_at=now,
                outbox_at=None,
                result_seq=base + ranked.c.rn,
                completes_group=case((and_(ranked.c.from_end == 1, ~ranked.c.busy), True), else_=False),
            ),
            execution_options=plain,
        ).rowcount
        if n:
            s.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(
                    finished_count=Job.finished_count + n, finished_at=now if base + n >= total else Job.finished_at
                ),
                execution_options=plain,
            )
        groups.after_cancel(s, job_id, base, base + n >= total if n else False)
        return n
