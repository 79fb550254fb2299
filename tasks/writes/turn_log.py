"""The turn log's write path: one fenced statement per turn, group-committed per process.

A turn row is inserted by `INSERT INTO turns ... SELECT ... FROM rollouts WHERE id = ? AND
lease_owner = ?` (PostgreSQL: `FOR SHARE` on that rollout row, so a concurrent take-over of the
lease either commits first and the SELECT finds nothing, or waits for this transaction): the
lease fence and the insert are one statement, and a worker presumed dead can never log a turn.
`ON CONFLICT DO NOTHING` makes a retried insert whose first commit landed harmless, and keeps
one refused row from aborting the batch it shares.

The RUN threads of one process hand their turns to its `TurnLog` (a part of the worker process,
`tasks.process.parts`: started with the pool, flushed when it stops), whose `TurnWriter`s write
what arrived within `turn_batch_window` seconds in one transaction (one commit for the batch
instead of one per turn). A turn is queued without waiting (`queue_turn` returns its future);
the stage settles it (`tasks.writes.run_turns.RunTurns.settle`) before the loop runs the next
turn's tool calls and before the hand-on, so the next generation overlaps the commit while
resume (`tasks.recovery.resume`) keeps its rule: a batch lost with its process (SIGKILL, a
crash, the database going away before the commit) holds at most one turn per rollout whose tool
calls ran, the turn in flight, which the resumed RUN generates and executes again exactly as it
would a turn whose tool calls were still running; nothing settled is lost and no turn index is
logged twice. What such a loss costs beyond that is the generation that was running meanwhile
(its tool calls had not started): the resumed RUN generates it again.

Writes that need no reply (clearing a rollout's generation mark, `clear_generating`) go
through the same queue: they commit with the next batch, in the order they were queued, so a
clear always lands before the turn record that follows it. The next mark never lands before
it either: a mark takes back its rollout's clears still queued (`drop_queued_clears`: the mark
writes the column itself) and waits for one already in a batch being written
(`wait_cleared`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, bindparam, exists, select, update
from sqlalchemy.dialects import postgresql, sqlite

from core import driver_statements
from core.db import get_engine
from core.errors import LeaseLost
from core.models import Rollout, Turn

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 0.005  # seconds; Settings.turn_batch_window
MAX_BATCH = 256  # writes per transaction at most


def fenced_turn_insert(
    dialect: str, rollout_id: str, attempt: int, lease: str, fields: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """`INSERT INTO turns (...) SELECT <values> FROM rollouts WHERE id = :rollout AND
    lease_owner = :lease [FOR SHARE] ON CONFLICT DO NOTHING`: the turn, fenced on the lease.

    Returned as (statement, parameters): the statement is built once per dialect and column
    set, so every turn executes the same object, whose compiled form the driver path keeps
    (`core.driver_statements`) instead of building and hashing a new tree per turn."""
    values = {"rollout_id": rollout_id, "attempt": attempt, **fields}
    statement = _turn_insert(dialect, tuple(values))
    params = {f"v_{name}": value for name, value in values.items()}
    params["f_rollout"], params["f_lease"] = rollout_id, lease
    return statement, params


@functools.lru_cache(maxsize=64)
def _turn_insert(dialect: str, columns: tuple[str, ...]) -> Any:
    table = Turn.__table__
    unknown = set(columns) - set(table.c.keys())
    if unknown:
        raise TypeError(f"not a turn column: {sorted(unknown)}")
    source = (
        select(*[bindparam(f"v_{name}", type_=table.c[name].type).label(name) for name in columns])
        .where(Rollout.id == bindparam("f_rollout"), Rollout.lease_owner == bindparam("f_lease"))
        .with_for_update(read=True)
    )  # FOR SHARE on PostgreSQL; SQLite ignores it
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    # RETURNING says whether the row went in (a DBAPI rowcount is not reliable for
    # INSERT ... SELECT ... ON CONFLICT: psycopg reports -1 through SQLAlchemy).
    return insert(table).from_select(list(columns), source).on_conflict_do_nothing().returning(table.c.index)


def _refused(conn: Connection, rollout_id: str, attempt: int, lease: str, index: Any) -> None:
    """After an insert that wrote no row: a retry whose first commit landed (fine), or a lost
    lease (LeaseLost)."""
    ours = conn.scalar(select(exists().where(Rollout.id == rollout_id, Rollout.lease_owner == lease)))
    if not ours:
        raise LeaseLost("the rollout moved on: turn not logged", rollout_id=rollout_id)
    log.info("rollout %s: turn %s of attempt %s was already logged", rollout_id, index, attempt)


def write_turn(conn: Connection, rollout_id: str, attempt: int, lease: str, fields: dict[str, Any]) -> None:
    """Insert one fenced turn on `conn` (inside the caller's transaction)."""
    statement, params = fenced_turn_insert(conn.dialect.name, rollout_id, attempt, lease, fields)
    if driver_statements.execute(conn, statement, params).first() is None:
        _refused(conn, rollout_id, attempt, lease, fields.get("index"))


def clear_generating(conn: Connection, rollout_id: str, lease: str) -> None:
    """Drop the rollout's generation mark (fenced on the lease; a lost lease clears nothing)."""
    driver_statements.execute(conn, _CLEAR_GENERATING, {"f_rollout": rollout_id, "f_lease": lease})


# Built once (see `fenced_turn_params`): executed with the rollout and lease as parameters.
_CLEAR_GENERATING = (
    update(Rollout)
    .where(
        Rollout.id == bindparam("f_rollout"),
        Rollout.lease_owner == bindparam("f_lease"),
        Rollout.generating_on.is_not(None),
    )
    .values(generating_on=None)
)


@dataclass
class _Write:
    """One queued write: a function of the batch's connection, for one rollout."""

    rollout_id: str
    apply: Callable[[Connection], None]
    clear: bool = False  # a generation mark's clear (what the next mark waits for)
    done: Future = field(default_factory=Future)


class TurnWriter:
    """Group commit of this process's turn-log writes (one thread, one transaction a batch)."""

    def __init__(self, db_url: str, window: float = DEFAULT_WINDOW) -> None:
        self.db_url, self.window = db_url, window
        self._queue: list[_Write] = []
        self._clears: dict[str, int] = {}  # rollout id -> queued or uncommitted clears
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._writing = 0  # writes taken into the batch being committed
        self.batches = 0  # committed transactions (the bench reads them)
        self.writes = 0

    def start(self) -> None:
        """Start the writer thread (once)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="raas-turn-writer", daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Wait (up to `timeout`) until every write queued so far committed. The thread stays
        (a daemon): a stage still running past its pool's shutdown can still write."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._writing:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("turn log: %d writes still queued at shutdown", len(self._queue) + self._writing)
                    return
                self._cond.wait(left)

    def record_turn(self, rollout_id: str, attempt: int, lease: str, fields: dict[str, Any]) -> None:
        """Log one turn; returns once its batch committed (LeaseLost if the fence refused)."""
        self.queue_turn(rollout_id, attempt, lease, fields).result()

    def queue_turn(self, rollout_id: str, attempt: int, lease: str, fields: dict[str, Any]) -> Future:
        """Queue one turn; its future resolves when its batch committed (LeaseLost if the
        fence refused, the database's error if the batch failed)."""
        return self.submit(rollout_id, lambda c: write_turn(c, rollout_id, attempt, lease, fields))

    def clear_generating(self, rollout_id: str, lease: str) -> Future:
        """Queue the mark's clear; it commits with the next batch (no wait)."""
        return self.submit(rollout_id, lambda c: clear_generating(c, rollout_id, lease), clear=True)

    def drop_queued_clears(self, rollout_id: str) -> int:
        """Take back the mark clears of `rollout_id` still queued (not in a batch being
        written); how many. The caller's next mark writes `generating_on` either way (the
        server's url, or NULL for a paused one), so a clear queued before it has nothing
        left to do, and the mark need not wait for the batch window."""
        with self._cond:
            mine = [w for w in self._queue if w.clear and w.rollout_id == rollout_id]
            if not mine:
                return 0
            self._queue = [w for w in self._queue if not (w.clear and w.rollout_id == rollout_id)]
            left = self._clears[rollout_id] - len(mine)
            if left:
                self._clears[rollout_id] = left
            else:
                del self._clears[rollout_id]
            self._cond.notify_all()
        for item in mine:
            item.done.set_result(None)
        return len(mine)

    def wait_cleared(self, rollout_id: str, timeout: float | None = None) -> None:
        """Block until no generation-mark clear of `rollout_id` is queued or in an
        uncommitted batch (its queued turns need not wait: they touch no mark)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._clears.get(rollout_id):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"rollout {rollout_id}: a generation mark's clear is still pending")
                self._cond.wait(left)

    def submit(self, rollout_id: str, apply: Callable[[Connection], None], clear: bool = False) -> Future:
        """Queue a write for the next batch; its future resolves when the batch committed."""
        item = _Write(rollout_id, apply, clear)
        with self._cond:
            self._queue.append(item)
            if self._thread is None:
                raise RuntimeError("the turn writer was not started (its process's parts start it)")
            if clear:
                self._clears[rollout_id] = self._clears.get(rollout_id, 0) + 1
            # Wake the writer only when it waits for a first write or the batch is full: in
            # its window it wakes on its own (a wake per write was a context switch per write).
            if len(self._queue) == 1 or len(self._queue) >= MAX_BATCH:
                self._cond.notify_all()
        return item.done

    def _take(self) -> list[_Write]:
        """The next batch: wait for a first write, then what arrives within the window."""
        with self._cond:
            while not self._queue:
                self._cond.wait()
            first_at = time.monotonic()
            while len(self._queue) < MAX_BATCH:
                left = first_at + self.window - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            self._writing = len(batch)
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            outcomes = self._commit(batch)
            with self._cond:
                for item in batch:
                    if not item.clear:
                        continue
                    left = self._clears[item.rollout_id] - 1
                    if left:
                        self._clears[item.rollout_id] = left
                    else:
                        del self._clears[item.rollout_id]
                self._writing = 0
                self._cond.notify_all()
            for item, error in zip(batch, outcomes):
                if error is None:
                    item.done.set_result(None)
                else:
                    item.done.set_exception(error)

    def _commit(self, batch: list[_Write]) -> list[BaseException | None]:
        """Run the batch in one transaction; per write, None or the error it gets.

        A write that refuses (LeaseLost) does not spoil the others. A database error aborts
        the transaction: every write of the batch gets it (their callers retry, `db_retry`).
        """
        outcomes: list[BaseException | None] = [None] * len(batch)
        try:
            # Rollout-id order (stable: a rollout's writes keep theirs), like the heartbeat's
            # row locks: two transactions never wait on each other's rows the other way round.
            order = sorted(range(len(batch)), key=lambda k: batch[k].rollout_id)
            with get_engine(self.db_url).begin() as conn:
                for k in order:
                    item = batch[k]
                    try:
                        item.apply(conn)
                    except LeaseLost as exc:
                        outcomes[k] = exc
            self.batches += 1
            self.writes += len(batch)
        except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
            log.warning("turn-log batch of %d writes failed: %s", len(batch), exc)
            return [exc] * len(batch)
        return outcomes


class TurnLog:
    """A process's turn-log writers (a part of the worker, `tasks.worker`): `lanes` TurnWriters,
    a rollout always on the same one (its writes stay in order), so two batches are in flight at
    once instead of one: a batch runs its statements one round trip after another, and one
    writer alone made 64 RUN slots wait on each other's round trips."""

    def __init__(self, db_url: str, window: float = DEFAULT_WINDOW, lanes: int = 2) -> None:
        self.lanes = [TurnWriter(db_url, window) for _ in range(lanes)]

    def start(self) -> None:
        """Start every lane's writer thread."""
        for lane in self.lanes:
            lane.start()

    def stop(self) -> None:
        """Wait until what was queued committed (`TurnWriter.stop`)."""
        for lane in self.lanes:
            lane.stop()

    def lane(self, rollout_id: str) -> TurnWriter:
        """The writer that carries `rollout_id`'s writes."""
        return self.lanes[zlib.crc32(rollout_id.encode()) % len(self.lanes)]

    def record_turn(self, rollout_id: str, attempt: int, lease: str, fields: dict[str, Any]) -> None:
        """`TurnWriter.record_turn` on the rollout's lane."""
        self.lane(rollout_id).record_turn(rollout_id, attempt, lease, fields)

    def queue_turn(self, rollout_id: str, attempt: int, lease: str, fields: dict[str, Any]) -> Future:
        """`TurnWriter.queue_turn` on the rollout's lane."""
        return self.lane(rollout_id).queue_turn(rollout_id, attempt, lease, fields)

    def clear_generating(self, rollout_id: str, lease: str) -> Future:
        """`TurnWriter.clear_generating` on the rollout's lane."""
        return self.lane(rollout_id).clear_generating(rollout_id, lease)

    def drop_queued_clears(self, rollout_id: str) -> int:
        """`TurnWriter.drop_queued_clears` on the rollout's lane."""
        return self.lane(rollout_id).drop_queued_clears(rollout_id)

    def wait_cleared(self, rollout_id: str, timeout: float | None = None) -> None:
        """`TurnWriter.wait_cleared` on the rollout's lane."""
        self.lane(rollout_id).wait_cleared(rollout_id, timeout)

    @property
    def batches(self) -> int:
        """Committed batches, all lanes."""
        return sum(lane.batches for lane in self.lanes)
