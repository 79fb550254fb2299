"""Straggler cuts: a group completes with its first `size` usable samples, or at its deadline.

A job that asks for `spare` samples per instance, or a `group_timeout`, gets one `groups` row
per instance. Every terminal write of a sample of such a job goes through `on_finish` inside
the same transaction as its completion number (the job's row lock orders them), so a group
closes exactly once:

- **complete**: the `size`-th usable sample finished. It carries `completes_group`; every
  sibling still open is cut (`cut_reason`, `cancel_requested`): one still queued for INIT ends
  here at once, a running one stops at its next turn or has its generation aborted (the
  heartbeat reads the cancel), exactly like a job cancel;
- **short**: every sample ended with fewer usable, or the deadline passed (`close_overdue`,
  the reaper): the members are the usable samples so far, the rest are cut the same way, and
  `reason` says why. At a deadline the last sample to end carries `completes_group` (those
  still running end within a heartbeat interval of the cut).

Usable means a policy sample, the trainer's contract (`raas_client.models.failure_class`):
graded (reward not null) with outcome `completed` or `agent_error` (reward 0). Infrastructure
failures (`infra_error`, `timeout`, a cancel) and a prompt that does not fit never fill a
group. A cut sample is never a member, whatever it ends with.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from core.db import session_scope
from core.models import (
    TERMINAL_VALUES,
    Group,
    GroupStatus,
    Job,
    Outcome,
    Rollout,
    Status,
    utcnow,
)
from tasks.writes import callbacks
from tasks.writes.db_retry import retrying

log = logging.getLogger(__name__)
PLAIN = {"synchronize_session": False}
USABLE_OUTCOMES = frozenset({Outcome.COMPLETED.value, Outcome.AGENT_ERROR.value})


def usable(outcome: str | None, reward: float | None) -> bool:
    """Whether a finished sample is a policy sample that may fill its group."""
    return reward is not None and outcome in USABLE_OUTCOMES


def create_rows(s: Session, job_id: str, instance_ids: list[str], size: int, timeout: float | None) -> None:
    """One open group per instance of a cut-enabled job (in the submission's transaction)."""
    s.execute(
        insert(Group),
        [
            {
                "job_id": job_id,
                "instance_id": i,
                "size": size,
                "timeout": timeout,
                "status": GroupStatus.OPEN.value,
                "members": [],
                "cut": [],
            }
            for i in instance_ids
        ],
    )


@retrying
def start(db_url: str, job_id: str, instance_id: str) -> None:
    """Start the group's clock when its first sample starts INIT (queue time never counts)."""
    now = utcnow()
    where = (Group.job_id == job_id, Group.instance_id == instance_id, Group.started_at.is_(None))
    with session_scope(db_url) as s:
        row = s.execute(select(Group.timeout).where(*where)).one_or_none()
        if row is None:
            return  # started already (or not a cut-enabled job)
        deadline = now + timedelta(seconds=row.timeout) if row.timeout is not None else None
        s.execute(update(Group).where(*where).values(started_at=now, deadline_at=deadline), execution_options=PLAIN)


def lock(s: Session, job_id: str, instance_id: str) -> None:
    """Take the group's row lock (first, before any rollout row: see `terminal.finish`)."""
    s.execute(select(Group.job_id).where(Group.job_id == job_id, Group.instance_id == instance_id).with_for_update())


def _locked(s: Session, job_id: str, instance_id: str) -> Group | None:
    """The group row, locked for this transaction (SQLite's write lock covers it already)."""
    return s.scalars(
        select(Group).where(Group.job_id == job_id, Group.instance_id == instance_id).with_for_update()
    ).one_or_none()


def _open_siblings(s: Session, job_id: str, instance_id: str) -> list[Any]:
    return s.execute(
        select(Rollout.id, Rollout.status, Rollout.lease_owner)
        .where(Rollout.job_id == job_id, Rollout.instance_id == instance_id, Rollout.status.not_in(TERMINAL_VALUES))
        .order_by(Rollout.sample_index)
    ).all()


def on_finish(
    s: Session,
    job_id: str,
    instance_id: str,
    rollout_id: str,
    outcome: str,
    reward: float | None,
    cut_reason: str | None,
) -> tuple[bool, int]:
    """Account one terminal sample of a cut-enabled job (inside `terminal.finish`).

    Returns (whether this sample completes its group, how many queued siblings were ended
    here by a cut: the caller numbers them after this one).
    """
    group = _locked(s, job_id, instance_id)
    if group is None:
        return False, 0
    now = utcnow()
    if group.status != GroupStatus.OPEN.value:
        # closed at a deadline (or by a job cancel): the last sample to end carries the flag
        return not _open_siblings(s, job_id, instance_id) and _claim_flag(group, rollout_id), 0
    members = list(group.members or [])
    if usable(outcome, reward) and cut_reason is None:
        members.append(rollout_id)
    open_rows = _open_siblings(s, job_id, instance_id)
    if len(members) >= group.size:
        ended = _close(
            s,
            group,
            members,
            open_rows,
            GroupStatus.COMPLETE,
            None,
            f"group complete: first {group.size} usable samples",
            now,
        )
        _claim_flag(group, rollout_id)
        return True, ended
    if not open_rows:
        unusable = _count(s, job_id, instance_id) - len(members)
        _close(
            s,
            group,
            members,
            [],
            GroupStatus.SHORT,
            f"{len(members)} of {group.size} usable: {unusable} sample(s) ended without "
            f"a policy result (infrastructure)",
            None,
            now,
        )
        _claim_flag(group, rollout_id)
        return True, 0
    group.members = members
    return False, 0


def _claim_flag(group: Group, rollout_id: str) -> bool:
    """Make `rollout_id` the group's closing row; False when one was chosen already."""
    if group.closer is not None:
        return False
    group.closer = rollout_id
    return True


def _count(s: Session, job_id: str, instance_id: str) -> int:
    return len(s.execute(select(Rollout.id).where(Rollout.job_id == job_id, Rollout.instance_id == instance_id)).all())


def _close(
    s: Session,
    group: Group,
    members: list[str],
    open_rows: list[Any],
    status: GroupStatus,
    reason: str | None,
    cut_reason: str | None,
    now: Any,
) -> int:
    """Close the group, cut its open samples; returns how many queued ones ended here."""
    cut = [r.id for r in open_rows]
    group.status, group.members, group.cut = status.value, members, cut
    group.reason, group.closed_at = reason, now
    if not cut:
        return 0
    why = cut_reason or f"group deadline: {reason}"
    s.execute(
        update(Rollout).where(Rollout.id.in_(cut)).values(cancel_requested=True, cut_reason=why[:256]),
        execution_options=PLAIN,
    )
    return _end_queued(
        s, group.job_id, [r.id for r in open_rows if r.status == Status.PENDING.value and r.lease_owner is None], why
    )


def _end_queued(s: Session, job_id: str, ids: list[str], why: str) -> int:
    """End cut samples that never started (no sandbox to release): cancelled at once, with
    the next completion numbers (the caller holds the job row's lock, so nobody else
    numbers meanwhile). A row claimed in between is skipped: its worker sees the cancel."""
    if not ids:
        return 0
    base = s.scalar(select(Job.finished_count).where(Job.id == job_id))
    now, ended = utcnow(), 0
    for rid in ids:  # in sample order
        ended += s.execute(
            update(Rollout)
            .where(Rollout.id == rid, Rollout.status == Status.PENDING.value, Rollout.lease_owner.is_(None))
            .values(
                status=Status.CANCELLED.value,
                outcome=Outcome.CANCELLED.value,
                error=f"cut: {why}"[:4000],
                finished_at=now,
                outbox_at=None,
                result_seq=base + ended + 1,
                completes_group=False,
            ),
            execution_options=PLAIN,
        ).rowcount
    if ended:
        s.execute(
            update(Job).where(Job.id == job_id).values(finished_count=Job.finished_count + ended),
            execution_options=PLAIN,
        )
    return ended


@retrying
def close_overdue(db_url: str) -> list[tuple[str, str]]:
    """Close the open groups whose deadline passed (the reaper): complete when they have their
    size, else short; returns the (job, instance) pairs closed."""
    now = utcnow()
    with session_scope(db_url) as s:
        due = s.execute(
            select(Group.job_id, Group.instance_id).where(
                Group.status == GroupStatus.OPEN.value, Group.deadline_at < now
            )
        ).all()
    closed = []
    for job_id, instance_id in due:
        if _close_one_overdue(db_url, job_id, instance_id):
            closed.append((job_id, instance_id))
    return closed


@retrying
def _close_one_overdue(db_url: str, job_id: str, instance_id: str) -> bool:
    with session_scope(db_url) as s:
        # the group, then the job: the order `terminal.finish` locks in
        group = _locked(s, job_id, instance_id)
        if group is None or group.status != GroupStatus.OPEN.value:
            return False
        job = s.execute(
            select(Job.finished_count, (Job.n_instances * Job.n_samples).label("total"), Job.callback_url, Job.owner)
            .where(Job.id == job_id)
            .with_for_update()
        ).one()
        members = list(group.members or [])
        open_rows = _open_siblings(s, job_id, instance_id)
        reason = f"group deadline ({group.timeout:g} s) passed with {len(members)} of {group.size} usable"
        status = GroupStatus.COMPLETE if len(members) >= group.size else GroupStatus.SHORT
        ended = _close(s, group, members, open_rows, status, reason, None, utcnow())
        if ended and ended == len(open_rows):  # nothing runs on: the last ended carries it
            last = s.scalar(
                select(Rollout.id)
                .where(
                    Rollout.job_id == job_id,
                    Rollout.instance_id == instance_id,
                    Rollout.status == Status.CANCELLED.value,
                )
                .order_by(Rollout.result_seq.desc())
                .limit(1)
            )
            s.execute(update(Rollout).where(Rollout.id == last).values(completes_group=True), execution_options=PLAIN)
            _claim_flag(group, last)
            job_done = job.finished_count + ended >= job.total
            callbacks.on_completions(s, job_id, job.owner, job.callback_url, group=view(group), job_done=job_done)
            if job_done:
                s.execute(update(Job).where(Job.id == job_id).values(finished_at=utcnow()), execution_options=PLAIN)
        log.info("job %s: group %s closed at its deadline (%s): %s", job_id, instance_id, status.value, reason)
        return True


def close_for_cancel(s: Session, job_id: str) -> None:
    """A cancelled job's open groups close short (its samples end as cancelled)."""
    s.execute(
        update(Group)
        .where(Group.job_id == job_id, Group.status == GroupStatus.OPEN.value)
        .values(status=GroupStatus.SHORT.value, reason="job cancelled", closed_at=utcnow()),
        execution_options=PLAIN,
    )


def view(group: Group) -> dict[str, Any]:
    """The wire form of a group record."""
    return {
        "instance_id": group.instance_id,
        "status": group.status,
        "size": group.size,
        "members": list(group.members or []),
        "cut": list(group.cut or []),
        "reason": group.reason,
        "closer": group.closer,
        "started_at": _iso(group.started_at),
        "closed_at": _iso(group.closed_at),
    }


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def records(s: Session, job_id: str, instance_ids: list[str] | None = None) -> dict[str, dict]:
    """The group records of a job (of some instances), by instance id."""
    q = select(Group).where(Group.job_id == job_id)
    if instance_ids is not None:
        q = q.where(Group.instance_id.in_(instance_ids))
    return {g.instance_id: view(g) for g in s.scalars(q.order_by(Group.instance_id))}


def payload(s: Any, job_id: str, instance_id: str, rollout_id: str, seq: int, group_size: int | None) -> dict[str, Any]:
    """What a group callback says: the group record, or (no cut) its samples."""
    if group_size is not None:
        return records(s, job_id, [instance_id])[instance_id]
    ids = s.scalars(
        select(Rollout.id)
        .where(Rollout.job_id == job_id, Rollout.instance_id == instance_id)
        .order_by(Rollout.result_seq)
    ).all()
    return {
        "instance_id": instance_id,
        "status": "complete",
        "members": list(ids),
        "cut": [],
        "reason": None,
        "closer": rollout_id,
        "seq": seq,
    }


def after_cancel(s: Any, job_id: str, base: int, job_done: bool) -> None:
    """A cancelled job's open groups close short; callbacks for what the cancel completed."""
    job = s.execute(select(Job.group_size, Job.callback_url, Job.owner).where(Job.id == job_id)).one()
    if job.group_size is not None:
        close_for_cancel(s, job_id)
    if not job.callback_url:
        return
    for rid, instance_id, seq in s.execute(
        select(Rollout.id, Rollout.instance_id, Rollout.result_seq).where(
            Rollout.job_id == job_id, Rollout.result_seq > base, Rollout.completes_group.is_(True)
        )
    ).all():
        callbacks.on_completions(
            s,
            job_id,
            job.owner,
            job.callback_url,
            job_done=False,
            group=payload(s, job_id, instance_id, rid, seq, job.group_size),
        )
    if job_done:
        callbacks.on_completions(s, job_id, job.owner, job.callback_url, job_done=True)
