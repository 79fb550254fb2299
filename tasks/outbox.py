"""The publication outbox: accepted rollouts reach the broker exactly when their rows exist.

A submission commits its rollouts with `outbox_at` set (the mark "not yet published") in the
same transaction as the insert, answers 202, and leaves publishing to a background thread of
the gateway (`OutboxPublisher`). That thread publishes the marked rows in batches — one
producer and one broker round trip per batch (a Redis pipeline) — and clears each batch's
mark after its messages are out. A gateway that dies between the commit and the publish leaves
marks behind; the reaper publishes whatever stayed marked longer than `outbox_grace` seconds
(`drain`). Publishing twice is harmless (the duplicate finds nothing to claim), so the rule is
simply: clear a mark only after its message was published.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from core.db import session_scope
from core.models import Rollout, Status, utcnow
from tasks.config import TASK_NAMES

log = logging.getLogger(__name__)
BATCH = 500  # messages per producer batch and per outbox statement
YIELD_EVERY = 10  # messages built between two releases of the GIL


def publish_many(celery: Any, messages: Iterable[tuple[str, str, int, str | None, str | None]],
                 batch: int = BATCH) -> int:
    """Publish (stage, rollout id, attempt, node, job id) messages over one producer connection.

    The job id lets a worker drop INIT messages of a job it knows was cancelled without a
    database write (see `lifecycle.known_cancelled`).

    On Redis every `batch` messages go out in one pipeline round trip (kombu's producer
    batch); transports without batching (the embedded filesystem) publish one by one.
    Returns how many were published.
    """
    n = 0
    with celery.producer_or_acquire() as producer:
        with producer.batch(max_size=batch):
            for stage, rollout_id, attempt, node, job in messages:
                kwargs = {k: v for k, v in (("node", node), ("job", job)) if v}
                celery.send_task(TASK_NAMES[stage], args=[rollout_id, attempt], kwargs=kwargs,
                                 producer=producer)
                n += 1
                # Building messages is pure CPU (no I/O releases the GIL within a pipelined
                # batch): yield it often so the gateway's request threads stay responsive.
                if n % YIELD_EVERY == 0:
                    time.sleep(0)
    return n


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def publish_marked(db_url: str, celery: Any, ids: Sequence[str]) -> int:
    """Publish INIT for those of `ids` still marked, then clear their marks; returns count.

    Rows unmarked meanwhile (cancelled, or drained by a reaper) are skipped, so a cancel that
    lands while a large job is being published stops the rest of it from reaching the broker.
    """
    n = 0
    for chunk in _chunks(ids, BATCH):
        with session_scope(db_url) as s:
            rows = s.execute(select(Rollout.id, Rollout.attempt, Rollout.job_id).where(
                Rollout.id.in_(chunk), Rollout.outbox_at.is_not(None))).all()
        if not rows:
            continue
        n += publish_many(celery, (("init", r.id, r.attempt, None, r.job_id) for r in rows))
        _clear(db_url, [r.id for r in rows])
    return n


def _clear(db_url: str, ids: list[str]) -> None:
    with session_scope(db_url) as s:
        s.execute(update(Rollout).where(Rollout.id.in_(ids)).values(outbox_at=None),
                  execution_options={"synchronize_session": False})


def drain(db_url: str, celery: Any, grace: float) -> int:
    """Publish what a gateway left marked for longer than `grace` seconds (the reaper's job).

    Each batch is first taken by re-stamping its marks (a conditional UPDATE), so several
    reapers do not publish the same batch; a reaper that dies after taking a batch leaves it
    marked, and the next pass after `grace` publishes it again.
    """
    total = 0
    while True:
        cutoff = utcnow() - timedelta(seconds=grace)
        with session_scope(db_url) as s:
            ids = s.scalars(select(Rollout.id).where(Rollout.outbox_at < cutoff)
                            .order_by(Rollout.outbox_at).limit(BATCH)).all()
            if not ids:
                return total
            taken = s.scalars(update(Rollout).where(
                Rollout.id.in_(ids), Rollout.outbox_at < cutoff,
                Rollout.status == Status.PENDING.value).values(outbox_at=utcnow())
                .returning(Rollout.id), execution_options={"synchronize_session": False}).all()
            # marks on rows that are no longer pending can only be leftovers: drop them
            s.execute(update(Rollout).where(Rollout.id.in_(ids), Rollout.outbox_at < cutoff)
                      .values(outbox_at=None), execution_options={"synchronize_session": False})
        if taken:
            log.warning("outbox: publishing %s rollouts a gateway left unpublished", len(taken))
            total += publish_marked(db_url, celery, taken)


class OutboxPublisher:
    """The gateway's background thread that publishes freshly committed submissions."""

    def __init__(self, db_url: str, celery: Any) -> None:
        self.db_url = db_url
        self.celery = celery
        self._work: queue.Queue[Sequence[str]] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def submit(self, ids: Sequence[str]) -> None:
        """Queue committed, marked rollout ids for publication (returns at once)."""
        self._ensure_thread()
        self._work.put(ids)

    def idle(self) -> bool:
        """True when nothing is waiting or being published (tests, benchmarks)."""
        return self._work.unfinished_tasks == 0

    def _ensure_thread(self) -> None:
        with self._lock:  # one thread per process: a forked gateway worker starts its own
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._work = queue.Queue()
                self._thread = threading.Thread(target=self._loop, name="raas-outbox",
                                                daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            ids = self._work.get()
            try:
                n = publish_marked(self.db_url, self.celery, ids)
                log.debug("outbox: published %s of %s rollouts", n, len(ids))
            except Exception:  # the marks stay: the reaper publishes them after the grace
                log.exception("outbox: publishing %s rollouts failed; the reaper will", len(ids))
            finally:
                self._work.task_done()


_publishers: dict[int, OutboxPublisher] = {}
_publishers_lock = threading.Lock()


def publisher_for(db_url: str, celery: Any) -> OutboxPublisher:
    """The process's publisher for this Celery app (created on first use)."""
    with _publishers_lock:
        pub = _publishers.get(id(celery))
        if pub is None or pub.celery is not celery:
            pub = _publishers[id(celery)] = OutboxPublisher(db_url, celery)
        return pub
