"""The turns one RUN handed to the turn log and has not yet seen durable.

`record` queues a turn in the process's group-commit turn log (`tasks.writes.turn_log.TurnLog`, a
part of the worker process) and returns at
once, so the next generation overlaps the commit; `settle` waits until every queued turn is
durable. The shared loop settles before a turn's tool calls run (`agents.loop`), the harness
path at each call, and the stage before the hand-on; a RUN that fails settles quietly first,
so its resume, retry or terminal write sees every turn it produced (`tasks.recovery.resume` says what
a batch lost with the process costs).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

from core.errors import LeaseLost
from tasks.writes import lifecycle
from tasks.writes.turn_log import TurnLog


class RunTurns:
    """One RUN's queued turns, in order, fenced on its lease."""

    def __init__(
        self, writes: TurnLog, db_url: str, rollout_id: str, attempt: int, lease: str, log: logging.LoggerAdapter
    ) -> None:
        self.writes, self.db_url, self.rollout_id, self.attempt, self.lease = writes, db_url, rollout_id, attempt, lease
        self.log = log
        self.unsettled: list[tuple[Future, dict[str, Any]]] = []  # (its batch's future, the turn)

    def record(self, **fields: Any) -> None:
        """Queue one turn (`RunContext.record_turn`); `settle` makes it durable."""
        future = self.writes.queue_turn(self.rollout_id, self.attempt, self.lease, fields)
        self.unsettled.append((future, fields))

    def settle(self) -> None:
        """Block until every queued turn is durable, in order (`RunContext.settle_turns`). A
        turn whose batch the database failed is written again on its own
        (`lifecycle.record_turn`, which retries like every stage write: the insert is
        idempotent); a refused fence raises LeaseLost."""
        while self.unsettled:
            future, fields = self.unsettled[0]
            try:
                future.result()
            except LeaseLost:
                self.unsettled.clear()
                raise
            except Exception as exc:  # noqa: BLE001 - the batch's database error: write it alone
                self.log.info("turn %s: its batch failed (%s); writing it again", fields.get("index"), exc)
                lifecycle.record_turn(
                    self.db_url, self.rollout_id, self.attempt, lease=self.lease, writes=self.writes, **fields
                )
            self.unsettled.pop(0)

    def settle_quietly(self) -> None:
        """`settle` on the way out of a failed RUN: the failure's handling then sees every
        turn the loop produced, and a turn that cannot be written (a lost lease) does not
        replace the failure that is propagating."""
        try:
            self.settle()
        except Exception as exc:  # noqa: BLE001 - the RUN's own error is what gets handled
            self.log.warning("turns still queued at the failure not logged: %s", exc)
            self.unsettled.clear()
