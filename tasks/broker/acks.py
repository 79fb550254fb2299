"""Acks and a consumer that survive a broker connection Celery already closed.

During a broker outage Celery's consumer closes its connection and reconnects; kombu then
clears the closed connection's transport (`client = None`). A task that finishes after that
(acks_late) acks its message on the old channel, which asks the cleared connection for its
hostname: `AttributeError: 'NoneType' object has no attribute 'hostname'` raised inside the
consumer's event loop, which Celery reports as an unrecoverable error and ends the worker.
The message belongs to a connection that is gone (kombu put it back on its queue when that
channel closed, or the reaper re-publishes its rollout), and the stage it carries finds
nothing left to claim. So ack, reject and requeue
treat those errors like any other lost connection: logged, and the consumer goes on.

Other paths can still raise such an error into the loop (kombu's `ack_log_error` re-raises a
broken pipe; the consumer's own decode/unknown-message rejects, and the restore of unacked
messages when a channel closes, pass only the connection errors). `StageConsumer` turns any
error that would end the consumer into what a connection error does: the consumer closes
its connection and starts again in the same process (with a backoff), so a pool never exits
because of one; only Celery's own shutdown ends it.
"""

from __future__ import annotations

import logging
import time

from celery.worker.consumer.consumer import STOP_CONDITIONS, Consumer
from celery.worker.request import Request

log = logging.getLogger(__name__)
# AttributeError: kombu's cleared connection (`_connparams`); OSError: sockets closed under it.
LOST_ACK_ERRORS = (AttributeError, OSError)
RESTART_BACKOFF = (1.0, 30.0)  # first and longest pause between in-process consumer restarts
HEALTHY_SECONDS = 60.0  # a consumer that ran this long starts over at the first backoff


class StageRequest(Request):
    """Celery's request, whose ack and reject treat a cleared connection as a lost one."""

    def _lost_errors(self) -> tuple[type[BaseException], ...]:
        return (*self._connection_errors, *LOST_ACK_ERRORS)

    def acknowledge(self) -> None:
        """Ack (late) on the hub; a connection closed meanwhile is logged, not raised."""
        if not self.acknowledged:
            self._on_ack(log, self._lost_errors())
            self.acknowledged = True

    def reject(self, requeue: bool = False) -> None:
        """Reject or requeue on the hub, with the same tolerance as `acknowledge`."""
        if not self.acknowledged:
            self._on_reject(log, self._lost_errors(), requeue)
            self.acknowledged = True


class StageConsumer(Consumer):
    """Celery's consumer, restarted in-process after any error that would end the worker."""

    def start(self) -> None:
        """Run the consumer; an unrecoverable error restarts it instead of ending the pool."""
        pause, started = RESTART_BACKOFF[0], time.monotonic()
        while True:
            try:
                return super().start()
            except Exception as exc:  # noqa: BLE001 - Celery's shutdowns are BaseExceptions
                if self.blueprint.state in STOP_CONDITIONS:
                    raise
                if time.monotonic() - started > HEALTHY_SECONDS:
                    pause = RESTART_BACKOFF[0]
                log.critical(
                    "the consumer failed (%r); restarting it in this process in "
                    "%.0fs (the pool keeps its running tasks)",
                    exc,
                    pause,
                    exc_info=True,
                )
                self._close_after(exc)
                time.sleep(pause)
                pause, started = min(pause * 2, RESTART_BACKOFF[1]), time.monotonic()

    def _close_after(self, exc: BaseException) -> None:
        """What Celery does after a connection error: drop the connection, stop the steps."""
        for step in (
            lambda: self.on_connection_error_after_connected(exc),
            self.on_close,
            self._cancel_connection_timer_entries,
            lambda: self.blueprint.restart(self),
        ):
            try:
                step()
            except Exception:  # noqa: BLE001 - a half-closed consumer is started afresh
                log.warning("closing the failed consumer: %s raised", step, exc_info=True)
