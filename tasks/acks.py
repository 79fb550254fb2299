"""Acks that survive a broker connection Celery already closed.

During a broker outage Celery's consumer closes its connection and reconnects; kombu then
clears the closed connection's transport (`client = None`). A task that finishes after that
(acks_late) acks its message on the old channel, which asks the cleared connection for its
hostname: `AttributeError: 'NoneType' object has no attribute 'hostname'` raised inside the
consumer's event loop, which Celery reports as an unrecoverable error and ends the worker.
The message belongs to a connection that is gone: Redis redelivers it after the visibility
timeout, and the stage it carries finds nothing left to claim. So the ack is logged as lost
with the connection, like any other connection error, and the consumer goes on.
"""
from __future__ import annotations

import logging

from celery.worker.request import Request

log = logging.getLogger(__name__)
LOST_ACK_ERRORS = (AttributeError,)


class StageRequest(Request):
    """Celery's request, whose ack and reject treat a cleared connection as a lost one."""

    def acknowledge(self) -> None:
        """Ack (late) on the hub; a connection closed meanwhile is logged, not raised."""
        if not self.acknowledged:
            self._on_ack(log, (*self._connection_errors, *LOST_ACK_ERRORS))
            self.acknowledged = True

    def reject(self, requeue: bool = False) -> None:
        """Reject on the hub, with the same tolerance as `acknowledge`."""
        if not self.acknowledged:
            self._on_reject(log, (*self._connection_errors, *LOST_ACK_ERRORS), requeue)
            self.acknowledged = True
