"""The stage writes' SQL, built once per process and executed with bound parameters.

A claim, a hand-off or a terminal write is one short UPDATE, yet building it anew on every
call (`update(...).where(...).values(...)`, the column comparisons, the cache key) cost more
CPU than executing it: a trivial rollout's three stages spent about a quarter of their CPU
constructing statements. Each statement here is built on first use, with `bindparam`s where
the values go, and kept: SQLAlchemy memoizes a statement object's cache key, so a later
execution goes straight to the compiled form. Statements whose SET columns vary with the
caller (what a stage stores at its hand-off or ending) are cached per set of column names.

Every bound parameter carries its column's type, so values are processed exactly as the ORM
would (JSON serialised, timestamps in SQLAlchemy's SQLite format): the fences that compare
a stored timestamp (`outbox_at == marked_at`) keep matching what was written.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import and_, bindparam, func, select, tuple_, update
from sqlalchemy.sql import Executable

from core.models import TERMINAL_VALUES, Job, Rollout, Status, sources_of

ROLLOUTS = Rollout.__table__
JOBS = Job.__table__
R = ROLLOUTS.c


def param(column: str, key: str | None = None) -> Any:
    """A bound parameter typed like the rollout column `column` (named `v_<column>`)."""
    return bindparam(key or f"v_{column}", type_=R[column].type)


def values_of(columns: tuple[str, ...]) -> dict[str, Any]:
    """SET clauses `column = :v_column` for `columns`."""
    return {name: param(name) for name in columns}


def bound(values: dict[str, Any]) -> dict[str, Any]:
    """Execution parameters for `values_of(tuple(values))`."""
    return {f"v_{name}": value for name, value in values.items()}


@lru_cache(maxsize=8)
def claim(init: bool, nodeless: bool = False) -> Executable:
    """The claim of a queued rollout (`lifecycle.claim`), returning the whole row.

    INIT sets the node; RUN and EVAL claim only on the node the rollout is queued for
    (`nodeless`: a rollout queued without one, `node IS NULL`). INIT claims nothing of a
    paused job (`tasks.writes.pauses`): the message is acked, the row stays queued without
    one, and the resume publishes it again. One primary-key probe of the job per INIT claim.
    """
    cond = [
        R.id == bindparam("k_rid"),
        R.attempt == bindparam("k_attempt"),
        R.status == bindparam("k_queued"),
        R.lease_owner.is_(None),
    ]
    if init:
        paused = select(JOBS.c.id).where(JOBS.c.id == R.job_id, JOBS.c.paused_at.is_not(None))
        cond.append(~paused.exists())
    else:
        cond.append(R.node.is_(None) if nodeless else R.node == bindparam("k_here"))
    columns = ("status", "lease_owner", "heartbeat_at", "stage_started_at", "outbox_at", "generating_on")
    values = {**values_of(columns), "paused_seconds": 0.0}
    if init:
        values["node"] = param("node")
    return update(ROLLOUTS).where(and_(*cond)).values(**values).returning(*ROLLOUTS.c)


@lru_cache(maxsize=64)
def hand_off(columns: tuple[str, ...]) -> Executable:
    """The hand-off of a leased rollout to the next stage's queue, setting `columns` too."""
    return (
        update(ROLLOUTS)
        .where(R.id == bindparam("k_rid"), R.lease_owner == bindparam("k_lease"), R.cancel_requested.is_(False))
        .values(**values_of(columns))
    )


@lru_cache(maxsize=8)
def handed_off() -> Executable:
    """Whether a rollout sits unleased in a queued status (a retried hand-off's own commit)."""
    return (
        select(func.count())
        .select_from(ROLLOUTS)
        .where(R.id == bindparam("k_rid"), R.status == bindparam("k_queued"), R.lease_owner.is_(None))
    )


@lru_cache(maxsize=8)
def clear_mark() -> Executable:
    """Drop the outbox mark of one published hand-off, fenced on the queued state."""
    return (
        update(ROLLOUTS)
        .where(
            R.id == bindparam("k_rid"),
            R.attempt == bindparam("k_attempt"),
            R.status == bindparam("k_queued"),
            R.lease_owner.is_(None),
            R.outbox_at.is_not(None),
        )
        .values(outbox_at=None)
    )


@lru_cache(maxsize=8)
def clear_marks(exact: bool) -> Executable:
    """Drop the outbox marks `:k_marks` (rollout id, attempt, queued status[, mark time]) of
    published hand-ons, each fenced on the queued, unleased row version it was set on (with
    `exact`, on the mark's own time too: a later hand-off's mark stays)."""
    key = (R.id, R.attempt, R.status, *((R.outbox_at,) if exact else ()))
    return (
        update(ROLLOUTS)
        .where(
            tuple_(*key).in_(bindparam("k_marks", expanding=True)),
            R.lease_owner.is_(None),
            R.outbox_at.is_not(None),
        )
        .values(outbox_at=None)
    )


@lru_cache(maxsize=128)
def finish(
    status: str,
    lease: bool,
    expect_status: tuple[str, ...] | None,
    fence: tuple[tuple[str, bool], ...],
    columns: tuple[str, ...],
) -> Executable:
    """The terminal UPDATE of `tasks.writes.terminal.finish`: fenced on the lease (`:lease`), on
    `expect_status`, and on the `fence` columns (`:f_<name>`, or IS NULL where the flag says
    so); sets `columns` (`:v_<name>`) and returns what the completion bookkeeping needs."""
    cond = [R.id == bindparam("k_rid"), R.status.in_(sources_of(Status(status)))]
    if lease:
        cond.append(R.lease_owner == bindparam("k_lease"))
    if expect_status is not None:
        cond.append(R.status.in_(expect_status))
    cond.extend(R[name].is_(None) if is_null else R[name] == param(name, f"f_{name}") for name, is_null in fence)
    return (
        update(ROLLOUTS)
        .where(and_(*cond))
        .values(**values_of(columns))
        .returning(R.job_id, R.instance_id, R.outcome, R.reward, R.cut_reason)
    )


@lru_cache(maxsize=8)
def count_finished() -> Executable:
    """Bump a job's completion counter, returning the new value and what decides the rest."""
    J = JOBS.c
    return (
        update(JOBS)
        .where(J.id == bindparam("k_job_id"))
        .values(finished_count=J.finished_count + 1)
        .returning(
            J.finished_count,
            (J.n_instances * J.n_samples).label("total"),
            J.n_samples,
            J.group_size,
            J.callback_url,
            J.owner,
        )
    )


@lru_cache(maxsize=8)
def group_unfinished() -> Executable:
    """How many rollouts of one instance's group are not terminal yet."""
    return (
        select(func.count())
        .select_from(ROLLOUTS)
        .where(
            R.job_id == bindparam("k_job_id"),
            R.instance_id == bindparam("k_instance_id"),
            R.status.not_in(TERMINAL_VALUES),
        )
    )


@lru_cache(maxsize=8)
def place_in_order() -> Executable:
    """Store a finished rollout's completion sequence number and whether it ends its group."""
    return (
        update(ROLLOUTS)
        .where(R.id == bindparam("k_rid"))
        .values(result_seq=bindparam("k_seq", type_=R.result_seq.type), completes_group=param("completes_group"))
    )


@lru_cache(maxsize=8)
def job_finished() -> Executable:
    """Stamp a job's end."""
    return (
        update(JOBS)
        .where(JOBS.c.id == bindparam("k_job_id"))
        .values(finished_at=bindparam("k_now", type_=JOBS.c.finished_at.type))
    )


@lru_cache(maxsize=8)
def beat() -> Executable:
    """Refresh the heartbeat of the leases `:k_leases`, returning each one's cancel flag.

    The rows are locked in id order first (FOR UPDATE in the subquery; SQLite serialises
    writers), the order the turn writer takes them in: a beat and a batch of turns never
    deadlock."""
    mine = select(R.id).where(R.lease_owner.in_(bindparam("k_leases", expanding=True))).order_by(R.id).with_for_update()
    return (
        update(ROLLOUTS)
        .where(R.id.in_(mine.scalar_subquery()), R.lease_owner.in_(bindparam("k_held", expanding=True)))
        .values(heartbeat_at=param("heartbeat_at"))
        .returning(R.lease_owner, R.cancel_requested)
    )
