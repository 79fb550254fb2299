"""Clearing the outbox marks of published hand-offs: batched, off the stage's thread.

A hand-off commits its status change with an outbox mark (`lifecycle.advance`); once the message
is out the mark only tells the reaper's drain not to publish it again, and the next stage's
claim drops it anyway. Clearing it was one more transaction per hand-on on the stage's own
thread (two per rollout), although for a rollout whose message is consumed at once the claim has
usually cleared it already. So a stage queues the clear here: its process's `MarkClearer` (a
part of the worker, `tasks.process.parts`) writes the marks queued within `DELAY` seconds in one
UPDATE, and on PostgreSQL without waiting for the WAL flush (`synchronous_commit = off`): losing
such a clear (the process or the database dies first) leaves a mark, whose only effect is that
the drain publishes that message again after `outbox_grace`, which the claim fences as a
duplicate.

Each clear is fenced on the exact mark it is for (rollout, attempt, queued status, unleased,
and the mark's own time), so a late clear never touches a later hand-off's mark.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text

from core.db import get_engine
from tasks.writes import statements

log = logging.getLogger(__name__)

# Seconds a clear waits for others to share its statement. Most marks are gone by then (the
# next stage's claim drops its mark): what is left is a backlog's, which only needs clearing
# before the drain's `outbox_grace`; a longer wait makes one statement of many clears.
DELAY = 0.5
MAX_BATCH = 200


@dataclass(frozen=True)
class Mark:
    """One published hand-off whose mark may go: the row version it was set on."""

    rollout_id: str
    attempt: int
    queued_status: str
    marked_at: datetime | None  # None: not known (a retried hand-off): fence without it


def clear_now(db_url: str, marks: list[Mark]) -> int:
    """Clear `marks` in one UPDATE per fence shape (an unsynchronised commit on PostgreSQL);
    rows changed. Prepared statements (`tasks.writes.statements.clear_marks`): each mark is one
    tuple of an expanding IN, not a clause built per mark."""
    timed = [(m.rollout_id, m.attempt, m.queued_status, m.marked_at) for m in marks if m.marked_at is not None]
    untimed = [(m.rollout_id, m.attempt, m.queued_status) for m in marks if m.marked_at is None]
    engine = get_engine(db_url)
    changed = 0
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL synchronous_commit TO OFF"))
        for exact, rows in ((True, timed), (False, untimed)):
            if rows:
                changed += conn.execute(statements.clear_marks(exact), {"k_marks": rows}).rowcount
    return changed


class MarkClearer:
    """A process's queue of clears and the thread that writes them."""

    def __init__(self, db_url: str, delay: float = DELAY) -> None:
        self.db_url, self.delay = db_url, delay
        self._queue: list[Mark] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False
        self.statements = 0

    def start(self) -> None:
        """Start the clearing thread (once)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="raas-mark-clearer", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Write the clears queued so far (bounded: a mark left is the drain's)."""
        self.flush()

    def clear(self, mark: Mark) -> None:
        """Queue one clear (never raises, never waits)."""
        with self._cond:
            self._queue.append(mark)
            self._cond.notify()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every clear queued so far was written (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    return

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
            time.sleep(self.delay)  # let the other slots' clears join this statement
            with self._cond:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                self._busy = True
            try:
                clear_now(self.db_url, batch)
                self.statements += 1
            except Exception as exc:  # noqa: BLE001 - a mark left is the drain's, not lost
                log.info("clearing %d outbox marks failed (the drain republishes them): %s", len(batch), exc)
            with self._cond:
                self._busy = False
                self._cond.notify_all()
