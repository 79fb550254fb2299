"""The publication outbox: accepted rollouts reach the broker exactly when their rows exist.

A submission commits its rollouts with `outbox_at` set (the mark "not yet published") in the
same transaction as the insert, answers 202, and leaves publishing to the gateway's
`OutboxPublisher` (a background thread for small jobs, a publisher process for large ones,
so the gateway's own threads keep answering; a part of the gateway process, which its factory
hangs on the Celery app as `raas_parts`, `tasks.process.parts`). It publishes the marked rows in batches — one
producer and one broker round trip per batch (a Redis pipeline) — and clears each batch's
mark after its messages are out. A gateway that dies between the commit and the publish leaves
marks behind; the reaper publishes whatever stayed marked longer than `outbox_grace` seconds
(`drain`). Publishing twice is harmless (the duplicate finds nothing to claim), so the rule is
simply: clear a mark only after its message was published.

A re-evaluation request of a done rollout uses the same mark: the gateway commits the request
(`extra["reevaluations_pending"]`) with the mark, publishes, and clears the mark it set;
`drain_reevaluations` publishes the pending requests of a done rollout whose mark stayed, and
the re-evaluation task removes its request when it records the result.

Stage hand-offs use the same mark: `lifecycle.advance` (RUN, EVAL) and `lifecycle.retry` (a
new attempt's INIT) commit it with the status change, the worker clears it after publishing,
and a claim clears it too. A hand-off whose broker stayed away past the worker's retries keeps
its mark, and the drain publishes it to the queue of the rollout's node.
"""

from __future__ import annotations

import importlib
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from core.db import session_scope
from core.models import Job, Rollout, Status, utcnow
from tasks.broker.config import PENDING_REEVALUATIONS
from tasks.broker.publish import StageMessage, publish, publish_reevaluation_message

log = logging.getLogger(__name__)
BATCH = 500  # messages per producer batch and per outbox statement
YIELD_EVERY = 10  # messages built between two releases of the GIL
INLINE_MAX = BATCH  # larger submissions are published by the publisher process
PROCESS_IDLE_EXIT = 60.0  # seconds the publisher process waits for work before exiting
PROCESS_TIMEOUT = 600.0  # longest wait for the publisher process to answer a hand-off


def publish_many(celery: Any, messages: Iterable[StageMessage], batch: int = BATCH) -> int:
    """Publish stage messages over one producer connection.

    The job id lets a worker drop INIT messages of a job it knows was cancelled without a
    database write (see `cancels.CancelMemory.known_cancelled`).

    Every `batch` messages go out in one Redis pipeline round trip (kombu's producer batch).
    Returns how many were published.
    """
    n = 0
    with celery.producer_or_acquire() as producer:
        with producer.batch(max_size=batch):
            for m in messages:
                # `tasks.broker.publish.publish` builds every stage message, one or a batch
                publish(
                    celery, m.stage, m.rollout_id, m.attempt, m.node, producer=producer, priority=m.priority, job=m.job
                )
                n += 1
                # Building messages is pure CPU (no I/O releases the GIL within a pipelined
                # batch): yield it often so the gateway's request threads stay responsive.
                if n % YIELD_EVERY == 0:
                    time.sleep(0)
    return n


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def publish_marked(db_url: str, celery: Any, ids: Sequence[str]) -> int:
    """Publish INIT for those of `ids` still marked, then clear their marks; returns count.

    Rows unmarked meanwhile (cancelled, or drained by a reaper) are skipped, so a cancel that
    lands while a large job is being published stops the rest of it from reaching the broker.
    """
    n = 0
    for chunk in _chunks(ids, BATCH):
        with session_scope(db_url) as s:
            rows = s.execute(
                select(Rollout.id, Rollout.attempt, Rollout.job_id, Job.priority)
                .join(Job, Job.id == Rollout.job_id)
                .where(Rollout.id.in_(chunk), Rollout.outbox_at.is_not(None))
            ).all()
        if not rows:
            continue
        n += publish_many(celery, (StageMessage("init", r.id, r.attempt, None, r.job_id, r.priority) for r in rows))
        _clear(db_url, [r.id for r in rows])
    return n


def _clear(db_url: str, ids: list[str]) -> None:
    with session_scope(db_url) as s:
        s.execute(
            update(Rollout).where(Rollout.id.in_(ids)).values(outbox_at=None),
            execution_options={"synchronize_session": False},
        )


QUEUED = (Status.PENDING.value, "run", "eval")  # statuses of a rollout waiting for a message


def drain(db_url: str, celery: Any, grace: float) -> int:
    """Publish what stayed marked for longer than `grace` seconds (the reaper's job): rollouts
    a gateway accepted but did not publish, and hand-offs (RUN, EVAL, a retry's INIT) whose
    worker could not reach the broker, each to its stage's queue on the rollout's node.

    Each batch is first taken by re-stamping its marks (a conditional UPDATE), so several
    reapers do not publish the same batch; a reaper that dies after taking a batch leaves it
    marked, and the next pass after `grace` publishes it again.
    """
    total = 0
    plain = {"synchronize_session": False}
    while True:
        cutoff, stamp = utcnow() - timedelta(seconds=grace), utcnow()
        with session_scope(db_url) as s:
            ids = _oldest_marked(s, cutoff, Rollout.status != Status.DONE.value)  # done: `drain_reevaluations`
            if not ids:
                return total
            taken = s.execute(
                update(Rollout)
                .where(
                    Rollout.id.in_(ids),
                    Rollout.outbox_at < cutoff,
                    Rollout.status.in_(QUEUED),
                    Rollout.lease_owner.is_(None),
                )
                .values(outbox_at=stamp)
                .returning(Rollout.id, Rollout.attempt, Rollout.status, Rollout.node, Rollout.job_id),
                execution_options=plain,
            ).all()
            # marks on rows claimed or ended meanwhile can only be leftovers: drop them
            s.execute(
                update(Rollout).where(Rollout.id.in_(ids), Rollout.outbox_at < cutoff).values(outbox_at=None),
                execution_options=plain,
            )
        if not taken:
            continue
        handed = sum(r.status != Status.PENDING.value for r in taken)
        log.warning(
            "outbox: publishing %s rollouts left unpublished (%s accepted by a gateway, %s handed on by a stage)",
            len(taken),
            len(taken) - handed,
            handed,
        )
        priority = job_priorities(db_url, {r.job_id for r in taken})
        total += publish_many(
            celery,
            (
                StageMessage(
                    "init" if r.status == Status.PENDING.value else r.status,
                    r.id,
                    r.attempt,
                    r.node,
                    r.job_id,
                    priority.get(r.job_id),
                )
                for r in taken
            ),
        )
        _clear_stamped(db_url, [r.id for r in taken], stamp)


def mark_reevaluation(rollout: Rollout, request_id: str) -> Any:
    """Add a re-evaluation request to a done rollout (in the caller's transaction, which holds
    its row): the request joins the pending list and the rollout gets an outbox mark. Returns
    the mark, for `publish_reevaluation`."""
    extra = dict(rollout.extra or {})
    extra[PENDING_REEVALUATIONS] = [*extra.get(PENDING_REEVALUATIONS, []), request_id]
    rollout.extra = extra
    rollout.outbox_at = utcnow()
    return rollout.outbox_at


def publish_reevaluation(db_url: str, celery: Any, rollout_id: str, request_id: str, mark: Any) -> None:
    """Publish a committed re-evaluation request, then clear the mark it set (a later request's
    mark stays). A publish that fails leaves the mark: the reaper's drain publishes it."""
    publish_reevaluation_message(celery, rollout_id, request_id)
    with session_scope(db_url) as s:
        s.execute(
            update(Rollout).where(Rollout.id == rollout_id, Rollout.outbox_at == mark).values(outbox_at=None),
            execution_options={"synchronize_session": False},
        )


def drain_reevaluations(db_url: str, celery: Any, grace: float) -> int:
    """Publish the pending re-evaluation requests of done rollouts whose mark stayed longer than
    `grace` seconds (the gateway could not publish them); returns how many were published.
    Each batch is taken by re-stamping its marks, as in `drain`."""
    total = 0
    while True:
        cutoff, stamp = utcnow() - timedelta(seconds=grace), utcnow()
        with session_scope(db_url) as s:
            ids = _oldest_marked(s, cutoff, Rollout.status == Status.DONE.value)
            if not ids:
                return total
            taken = s.execute(
                update(Rollout)
                .where(Rollout.id.in_(ids), Rollout.outbox_at < cutoff)
                .values(outbox_at=stamp)
                .returning(Rollout.id, Rollout.extra),
                execution_options={"synchronize_session": False},
            ).all()
        for row in taken:
            for request_id in (row.extra or {}).get(PENDING_REEVALUATIONS, []):
                log.warning("outbox: publishing re-evaluation %s of %s left unpublished", request_id, row.id)
                publish_reevaluation_message(celery, row.id, request_id)
                total += 1
        _clear_stamped(db_url, [r.id for r in taken], stamp)


def _oldest_marked(s: Any, cutoff: Any, status_clause: Any) -> list[str]:
    """Ids of up to BATCH rollouts marked before `cutoff` whose status matches, oldest first."""
    return list(
        s.scalars(
            select(Rollout.id).where(Rollout.outbox_at < cutoff, status_clause).order_by(Rollout.outbox_at).limit(BATCH)
        ).all()
    )


def _clear_stamped(db_url: str, ids: list[str], stamp: Any) -> None:
    """Clear the marks a drain pass set on `ids` (a later pass's or a new request's mark stays)."""
    with session_scope(db_url) as s:
        s.execute(
            update(Rollout).where(Rollout.id.in_(ids), Rollout.outbox_at == stamp).values(outbox_at=None),
            execution_options={"synchronize_session": False},
        )


def job_priorities(db_url: str, job_ids: set[str]) -> dict[str, int]:
    """The priority of each job (the drain's messages keep their job's place)."""
    with session_scope(db_url) as s:
        return dict(s.execute(select(Job.id, Job.priority).where(Job.id.in_(job_ids))).all())


class OutboxPublisher:
    """Publishes freshly committed submissions for the gateway, off the request path.

    Small submissions (up to `INLINE_MAX` rollouts) are published by a background thread of
    the gateway: a 1-rollout job starts at once. Building thousands of messages is CPU that
    would hold the gateway's GIL for seconds and stall its request threads (a /healthz poll
    took up to 263 ms during a 10,000-rollout publication), so larger ones are handed to a
    publisher process (`_publisher_process`) started on first need; it exits after idling
    `PROCESS_IDLE_EXIT` seconds. A hand-off whose process dies is sent again to a fresh one;
    if that fails too, the marks stay and the reaper publishes them after `outbox_grace`.
    """

    def __init__(self, db_url: str, celery: Any) -> None:
        self.db_url = db_url
        self.celery = celery
        self._lock = threading.Lock()
        self._pid = 0
        self._queues: dict[str, queue.Queue[Sequence[str]]] = {}
        self._process: Any = None
        self._conn: Any = None

    def start(self) -> None:
        """Start the publishing threads of this process (a forked gateway worker starts its
        own at its first `submit`)."""
        self._ensure_threads()

    def stop(self, timeout: float = 10.0) -> None:
        """Wait (up to `timeout`) until what was submitted is published; what is not keeps
        its mark, which the reaper's drain publishes."""
        deadline = time.monotonic() + timeout
        while not self.idle() and time.monotonic() < deadline:
            time.sleep(0.05)

    def submit(self, ids: Sequence[str]) -> None:
        """Queue committed, marked rollout ids for publication (returns at once)."""
        large = len(ids) > INLINE_MAX
        self._ensure_threads()
        self._queues["process" if large else "inline"].put(ids)

    def idle(self) -> bool:
        """True when nothing is waiting or being published (tests, benchmarks)."""
        return all(q.unfinished_tasks == 0 for q in self._queues.values())

    def _ensure_threads(self) -> None:
        with self._lock:  # one set per process: a forked gateway worker starts its own
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._process = self._conn = None
            for name, publish in (("inline", self._publish_inline), ("process", self._publish_in_process)):
                self._queues[name] = work = queue.Queue()
                threading.Thread(
                    target=self._loop, args=(work, publish), name=f"raas-outbox-{name}", daemon=True
                ).start()

    def _loop(self, work: queue.Queue[Sequence[str]], publish: Any) -> None:
        while True:
            ids = work.get()
            try:
                publish(ids)
            except Exception:  # the marks stay: the reaper publishes them after the grace
                log.exception("outbox: publishing %s rollouts failed; the reaper will", len(ids))
            finally:
                work.task_done()

    def _publish_inline(self, ids: Sequence[str]) -> None:
        n = publish_marked(self.db_url, self.celery, ids)
        log.debug("outbox: published %s of %s rollouts", n, len(ids))

    def _publish_in_process(self, ids: Sequence[str]) -> None:
        for attempt in (1, 2):
            conn = self._child()
            try:
                conn.send(list(ids))
                if not conn.poll(PROCESS_TIMEOUT):
                    raise TimeoutError(f"no answer in {PROCESS_TIMEOUT} s")
                n = conn.recv()
                log.debug("outbox: publisher process published %s of %s", n, len(ids))
                return
            except (EOFError, OSError, TimeoutError) as exc:  # it exited (idle) or died
                log.info("outbox: publisher process gone (%s), attempt %s", exc, attempt)
                self._stop_child()
        raise RuntimeError("the outbox publisher process failed twice")

    def _child(self) -> Any:
        if self._process is None or self._process.poll() is not None:
            self._stop_child()
            ours, theirs = socket.socketpair()
            env = dict(
                os.environ,
                PYTHONPATH=os.pathsep.join(
                    [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
                ),
            )
            # a fresh interpreter (not fork: the gateway has threads; not multiprocessing's
            # spawn: it would re-run the embedding program's __main__)
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    f"from tasks.broker.outbox import _publisher_process as p; p({theirs.fileno()})",
                ],
                pass_fds=[theirs.fileno()],
                env=env,
                stdin=subprocess.DEVNULL,
            )
            theirs.close()
            self._conn = Connection(ours.detach())
            self._conn.send((self.celery.raas_settings, self.celery.raas_factory))
        return self._conn

    def _stop_child(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            self._process.kill()
            self._process.wait(5)
        self._process = self._conn = None


def _publisher_process(fd: int) -> None:
    """The publisher process (`fd`: its end of the socket pair): receives the gateway's
    settings and the factory that made its Celery app (`module:function`: this wing never
    imports the app's composition), then publishes each batch of ids it is sent and answers
    with the count.

    Exits when the gateway's end closes or after `PROCESS_IDLE_EXIT` idle seconds (a
    hand-off crossing that exit is sent again by the gateway to a fresh process).
    """
    conn = Connection(fd)
    settings, factory = conn.recv()
    module, name = factory.split(":")
    celery = getattr(importlib.import_module(module), name)(settings)
    while conn.poll(PROCESS_IDLE_EXIT):
        try:
            ids = conn.recv()
        except EOFError:
            return
        try:
            n = publish_marked(settings.db_url, celery, ids)
        except Exception:  # the marks stay: the reaper publishes them after the grace
            log.exception("outbox: publishing %s rollouts failed; the reaper will", len(ids))
            n = 0
        conn.send(n)
