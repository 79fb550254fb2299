"""Which server a session's turn goes to, and the waits for it (`ServerHold`, the base of
`LLMSession`).

A session holds one in-flight slot on one server for its whole life and keeps coming back to it
(its prefix cache is there); it moves only when that server fails or leaves the pool. A server
the trainer paused (weights loading) is waited for, never failed: the wait is not the rollout's
time (its deadline moves on by it, and the time is written to the rollout for the reaper). When
no server is healthy the turn waits a bounded time, within its deadline, before giving up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agents.llm.pool import ServerInfo, ServerPool, ServersPaused
from core.errors import ConfigError, RolloutCancelled, ServiceUnavailable, StageTimeout

log = logging.getLogger(__name__)

NO_SERVER_RETRY_SECONDS = 0.5
# When every server is down, keep trying this long (within the deadline) before giving up.
NO_SERVER_WAIT_SECONDS = 30.0
# How often a turn waiting on a paused server (or after an aborted request) looks again.
PAUSE_POLL_SECONDS = 0.25
# How often a wait on a paused pool is written to the rollout: the reaper subtracts it from
# the stage's age, so what is not yet written must stay well under its `stage_grace`.
PAUSE_REPORT_SECONDS = 1.0


class ServerHold:
    """The server a rollout holds in `pool`, and the running turn's waits for one."""

    def __init__(self, pool: ServerPool, rollout_id: str, logprobs_mode: str | None) -> None:
        self.pool = pool
        self.rollout_id = rollout_id
        self._logprobs_mode = logprobs_mode  # what the job needs a server to declare, if anything
        self.server: ServerInfo | None = None
        self._stuck_url: str | None = None
        # The running turn: its deadline (moved on by pause waits), cancel check, pause time.
        self._deadline = 0.0
        self._cancelled: Callable[[], bool] | None = None
        self._paused = self._unreported = 0.0

    def _server_for_turn(self, tried: set[str]) -> ServerInfo:
        """The sticky server (re-read: weight version may change), else a fresh pick; the
        rollout is marked as generating on it when this returns (`pool.begin_generation`).

        A paused server (weights loading) is waited for, without charging the deadline: the
        rollout keeps its slot and its prefix cache, and the turn records the new version.
        """
        if self.server is not None:
            current = self._unpaused(self.server.url)
            if current is not None:
                self.server = current
                return self._check_mode(current)
            log.info("rollout %s: server %s left the pool", self.rollout_id, self.server.url)
            self.pool.release(self.server.url)
            self.server = None
        if not tried:
            sticky = self.pool.sticky_url()
            self.server = self.pool.take(sticky) if sticky else None
        if self.server is None:
            self.server = self._acquire(tried)
        if self._stuck_url != self.server.url:
            self.pool.stick(self.server.url)
            self._stuck_url = self.server.url
        return self._server_for_turn(tried)  # now the held server: wait, mark, re-read

    def _unpaused(self, url: str) -> ServerInfo | None:
        """The server's current info once it is not paused, with the rollout marked as
        generating on it (None if it left the pool)."""
        current = self.pool.begin_generation(url)
        while current is not None and current.paused:
            self._wait_paused(f"waiting for paused server {url}")
            current = self.pool.begin_generation(url)
        return current

    def _check_mode(self, server: ServerInfo) -> ServerInfo:
        """Refuse a server whose logprobs are not the kind the job asked for."""
        wanted = self._logprobs_mode
        if wanted is not None and server.logprobs_mode != wanted:
            raise ConfigError(
                f"llm.logprobs_mode: the job needs {wanted} but {server.url} declares {server.logprobs_mode}"
            )
        return server

    def _acquire(self, tried: set[str]) -> ServerInfo:
        """Pick a server, waiting (bounded by the deadline) while none is healthy and (not
        charged) while every one is paused."""
        give_up = min(self._deadline, time.monotonic() + NO_SERVER_WAIT_SECONDS)
        while True:
            try:
                return self.pool.acquire(exclude=frozenset(tried))
            except ServersPaused:
                self._wait_paused("every server is paused")
                give_up = min(self._deadline, time.monotonic() + NO_SERVER_WAIT_SECONDS)
            except ServiceUnavailable as exc:
                if time.monotonic() + NO_SERVER_RETRY_SECONDS >= give_up:
                    raise ServiceUnavailable(f"rollout {self.rollout_id}: {exc.message}") from exc
                tried.clear()  # the pool skips servers marked down until they probe healthy
                time.sleep(NO_SERVER_RETRY_SECONDS)

    def _fail_over(self, server: ServerInfo, error: str) -> None:
        log.warning("rollout %s: LLM server %s failed, moving on: %s", self.rollout_id, server.url, error)
        self.pool.mark_down(server.url, error)
        self.pool.release(server.url)
        self.server = None

    def _sleep_before(self, deadline: float, why: str) -> None:
        """Wait a poll interval, or raise StageTimeout if the deadline comes first."""
        if time.monotonic() + PAUSE_POLL_SECONDS >= deadline:
            raise StageTimeout(f"rollout {self.rollout_id}: deadline passed while {why}")
        time.sleep(PAUSE_POLL_SECONDS)

    def _wait_paused(self, why: str) -> None:
        """Wait one poll for a paused pool. Not charged to the rollout: its deadline moves on
        by the wait (the stage's clock in the database too, for the reaper); a cancel still
        stops it."""
        if self._cancelled is not None and self._cancelled():
            raise RolloutCancelled(f"rollout cancelled while {why}", rollout_id=self.rollout_id)
        started = time.monotonic()
        time.sleep(PAUSE_POLL_SECONDS)
        waited = time.monotonic() - started
        self._deadline += waited
        self._paused += waited
        self._unreported += waited
        if self._unreported >= PAUSE_REPORT_SECONDS:
            self._report_paused()

    def _report_paused(self) -> None:
        """Write the pause time not yet recorded on the rollout."""
        if self._unreported > 0:
            self.pool.note_paused(self._unreported)
            self._unreported = 0.0
