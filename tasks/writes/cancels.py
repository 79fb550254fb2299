"""Cancelling a job: the set operations that end it, and a worker's memory of cancelled jobs.

A cancel marks every unfinished rollout and ends the ones still queued for INIT in one
statement; the gateway then removes their messages from the broker (`tasks.broker.purge`). The
workers learn of it from the rollout row (running ones at their next turn) or from
`CancelMemory.known_cancelled` (stale first-attempt messages dropped without a database write);
a worker that drops one purges the job's others (`drop_stale`), so what the gateway's purge
missed (Redis away at the cancel, messages published after it) leaves the queue in one pass too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from sqlalchemy import and_, case, exists, func, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import aliased

from core.db import session_scope
from core.models import ACTIVE, TERMINAL_VALUES, Job, Outcome, Rollout, Status, utcnow
from tasks.writes import groups
from tasks.broker import purge

log = logging.getLogger(__name__)

CANCELLED_JOBS_KEPT = 4096
DROPPED = "dropped: the job was cancelled"  # what an INIT task that dropped its message returns
PURGE_EVERY = 2.0  # seconds between one process's purges of the same cancelled job


class CancelMemory:
    """A worker process's memory of cancelled jobs (a part of it, `tasks.process.parts`): the
    jobs it saw cancelled, most recent last, and when it last purged each one's messages."""

    def __init__(self, kept: int = CANCELLED_JOBS_KEPT) -> None:
        self.kept = kept
        self._cancelled: OrderedDict[str, None] = OrderedDict()
        self._purged_at: dict[str, float] = {}  # job -> when this process last started purging it
        self._lock = threading.Lock()

    def known_cancelled(self, job_id: str) -> bool:
        """True when this process saw that the job was cancelled (memory only, no query).

        Lets an INIT worker drop the stale first-attempt messages of a cancelled job without a
        database write each: after the cancel's commit no first attempt of that job can be
        claimed (the cancel ended every queued one; a retry is attempt 2 or later and is claimed
        as usual, then ends as cancelled when it sees the flag).
        """
        with self._lock:
            return job_id in self._cancelled

    def drop_stale(self, celery: Any, job_id: str) -> str:
        """A worker met a stale message of a cancelled job: remove the job's others from the
        broker too, unless this process did so within `PURGE_EVERY` seconds (or is doing so now
        in another thread). Each would otherwise be one Celery delivery; returns `DROPPED`."""
        now = time.monotonic()
        with self._lock:
            if now - self._purged_at.get(job_id, -PURGE_EVERY) < PURGE_EVERY:
                return DROPPED
            self._purged_at[job_id] = now
            while len(self._purged_at) > self.kept:
                del self._purged_at[next(iter(self._purged_at))]
        purge.purge_quietly(celery, job_id)
        with self._lock:  # the next purge is due PURGE_EVERY after this one ended
            self._purged_at[job_id] = time.monotonic()
        return DROPPED

    def note_if_cancelled(self, db_url: str, job_id: str) -> bool:
        """Read whether the job was cancelled and remember it if so (cancel is permanent)."""
        with session_scope(db_url) as s:
            cancelled = bool(s.scalar(select(Job.cancel_requested).where(Job.id == job_id)))
        if cancelled:
            with self._lock:
                self._cancelled[job_id] = None
                while len(self._cancelled) > self.kept:
                    self._cancelled.popitem(last=False)
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
