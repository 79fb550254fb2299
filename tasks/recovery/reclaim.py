"""Work whose worker or node is gone: a resume, a hand-back, or a new attempt (the reaper's
lease recovery).

- lost leases (no heartbeat for `lease_timeout`, `reclaim_lost`): a RUN whose sandbox still
  answers on this node continues in it from its logged turns, a lost EVAL grades its stored
  artifact again (`tasks.recovery.resume`; work of another node is left to that node's reaper for a
  second lease time); anything else gets a new attempt from INIT, or `infra_error` after
  `max_attempts` (a new attempt's RUN replays the logged turns into its rebuilt sandbox and
  generates only the turn that was in flight again: `tasks.recovery.resume`, `agents.loop_replay`);
- rollouts abandoned by their node (`reroute_abandoned`): a node whose reaper and workers
  all stopped beating for `node_timeout` is dead, and a queue of a live node whose consumers
  all stopped beating is as good as dead; what waits there or is leased there and waits for
  EVAL moves to a live node's EVAL queue (its artifact is stored: `tasks.recovery.handback`), the rest
  gets a new attempt from INIT on a live node (bounded by `max_attempts`), instead of a
  re-publish into a queue nobody reads.

Each rule acts on a row through a conditional UPDATE fenced on what it observed (the lease,
or attempt + status + node of a queued row), so two reapers never both retry a row.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, false, or_, select

from core.db import session_scope
from core.models import Job, Outcome, Rollout, Status, utcnow
from core.settings import Settings
from tasks.recovery import handback, nodes, resume
from tasks.writes import lifecycle, terminal
from tasks.sandboxing import sandboxes
from tasks.broker.config import STAGES as ACTIVE_STAGES
from tasks.broker.config import stage_queue
from tasks.broker.publish import publish

log = logging.getLogger(__name__)


class ReclaimRules:
    """The reaper's lease-recovery rules (a part of `tasks.recovery.reaper.Reaper`, which sets these
    attributes and `_db_back_at`, the moment the database answered again after an outage)."""

    settings: Settings
    db: str
    celery: Any
    _db_back_at: float | None

    def reclaim_lost(self) -> int:
        """New attempt (or infra_error) for leases whose holder stopped beating.

        Right after a database outage this reaper saw, no lease is judged for a lease time:
        heartbeats could not be written during the outage, so their age says nothing yet.
        """
        if self._db_back_at is not None and time.monotonic() - self._db_back_at < self.settings.lease_timeout:
            return 0
        cutoff = utcnow() - timedelta(seconds=self.settings.lease_timeout)
        with session_scope(self.db) as s:
            rows = s.execute(
                select(
                    Rollout.id,
                    Rollout.lease_owner,
                    Rollout.attempt,
                    Rollout.sandbox,
                    Rollout.status,
                    Rollout.node,
                    Rollout.resumes,
                    Rollout.heartbeat_at,
                    Job.agent,
                )
                .join(Job, Job.id == Rollout.job_id)
                .where(
                    Rollout.status.in_(ACTIVE_STAGES), Rollout.lease_owner.is_not(None), Rollout.heartbeat_at < cutoff
                )
            ).all()
        n = 0
        for row in rows:
            reason = f"{row.status}: worker {row.lease_owner} stopped beating"
            if row.status in ("run", "eval") and self._resumed_or_deferred(row, reason):
                continue
            if row.status == "eval" and self._eval_moved(row, reason):
                n += 1
                continue
            if row.attempt >= self.settings.max_attempts:
                done = terminal.finish(
                    self.db, row.id, Status.FAILED, Outcome.INFRA_ERROR.value, lease=row.lease_owner, error=reason
                )
            else:
                new = lifecycle.retry(self.db, row.id, expect_lease=row.lease_owner, error=reason)
                done = new is not None
                if done:  # the retry's outbox mark covers a publish that fails here
                    publish(self.celery, "init", row.id, new)
                    lifecycle.clear_mark(self.db, row.id, new, Status.PENDING.value)
            if done:
                n += 1
                log.warning("rollout %s: %s", row.id, reason)
                if row.sandbox and row.sandbox.get("node", self.settings.node) == self.settings.node:
                    sandboxes.release(row.sandbox)
        return n  # the rows this reaper took (another may have taken the rest)

    def reroute_abandoned(self) -> int:
        """New attempt from INIT (or infra_error after `max_attempts`) for rollouts leased or
        queued on a dead node, and queued for RUN/EVAL of a live node that nobody consumes.

        A dead node's sandboxes cannot be reached, and a queue without a consumer is never
        read: re-publishing into either strands the rollout forever. A queue of a live node
        gets `node_timeout` after the rollout was queued (time for a supervisor to restart
        its pool). `run_once` calls it only once this reaper has watched the database for
        `node_timeout` without a gap. Separate from `reclaim_lost`, which judges one
        worker's lease.
        """
        known = nodes.known_nodes(self.db)
        if not known:
            return 0
        timeout = self.settings.node_timeout
        dead = set(nodes.dead_nodes(self.db, timeout, exclude=self.settings.node))
        live = nodes.live_queues(self.db, timeout)
        deserted = [
            (stage, node)
            for node in sorted(known - dead)
            for stage in ("run", "eval")
            if stage_queue(stage, node) not in live
        ]
        if not dead and not deserted:
            return 0
        cutoff = utcnow() - timedelta(seconds=timeout)
        with session_scope(self.db) as s:
            rows = s.execute(
                select(
                    Rollout.id,
                    Rollout.attempt,
                    Rollout.status,
                    Rollout.node,
                    Rollout.lease_owner,
                    Rollout.heartbeat_at,
                    Rollout.sandbox,
                ).where(
                    Rollout.status.in_(ACTIVE_STAGES),
                    or_(
                        Rollout.node.in_(dead),
                        and_(
                            Rollout.lease_owner.is_(None),
                            Rollout.queued_at < cutoff,
                            or_(
                                false(),
                                *[and_(Rollout.status == stage, Rollout.node == node) for stage, node in deserted],
                            ),
                        ),
                    ),
                )
            ).all()
        n = 0
        for row in rows:
            if row.lease_owner and (lifecycle.seconds_since(row.heartbeat_at) or 0) < timeout:
                continue  # still beating: not dead after all (clock skew); reclaim_lost judges
            why = (
                f"node {row.node} stopped beating"
                if row.node in dead
                else f"queue {stage_queue(row.status, row.node)} has no live consumer"
            )
            if row.status == "eval":  # its artifact is stored: graded elsewhere, not re-run
                n += handback.hand_back(self.settings, self.celery, row, f"eval: {why}") is not None
                continue
            n += self._restart_elsewhere(row, f"{row.status}: {why}")
        return n

    def _restart_elsewhere(self, row: Any, reason: str) -> int:
        """Retry (or fail) one rollout fenced on the version observed; 1 if this reaper did."""
        fence = {"attempt": row.attempt, "status": row.status, "node": row.node, "lease_owner": row.lease_owner}
        if row.attempt >= self.settings.max_attempts:
            done = terminal.finish(self.db, row.id, Status.FAILED, Outcome.INFRA_ERROR.value, fence=fence, error=reason)
        else:
            new = lifecycle.retry(self.db, row.id, expect_lease=row.lease_owner, fence=fence, error=reason)
            done = new is not None
            if done:  # the retry's outbox mark covers a publish that fails here
                publish(self.celery, "init", row.id, new)
        if done:
            log.warning(
                "rollout %s: %s; %s",
                row.id,
                reason,
                "restarted from INIT" if row.attempt < self.settings.max_attempts else "failed: no attempts left",
            )
        return int(done)

    def _eval_moved(self, row: Any, reason: str) -> bool:
        """A lost EVAL that its node did not grade again (another node's, or gone): graded
        on a live node within the attempt's resume budget, instead of a re-run from INIT."""
        if resume.resumes_of_attempt(row.resumes, row.attempt) >= self.settings.max_resumes:
            return False
        if handback.eval_node(self.settings, exclude=None) is None:
            return False
        return handback.hand_back(self.settings, self.celery, row, reason, counted=True) is not None

    def _resumed_or_deferred(self, row: Any, reason: str) -> bool:
        """A lost RUN: resumed here if its sandbox lives here and answers; a lost EVAL: graded
        again on its node. Left alone for a second lease time if it belongs to another node
        (that node's reaper decides)."""
        node = (row.sandbox or {}).get("node") or row.node
        if node != self.settings.node:
            age = lifecycle.seconds_since(row.heartbeat_at) or 0
            return age < 2 * self.settings.lease_timeout
        if row.status == "eval":
            if not resume.regrade(
                self.settings, row.id, row.attempt, row.resumes, row.sandbox, reason, expect_lease=row.lease_owner
            ):
                return False
            publish(self.celery, "eval", row.id, row.attempt, node)  # the mark covers it
            lifecycle.clear_mark(self.db, row.id, row.attempt, "eval")
            return True
        if not resume.resumable(self.settings, row.agent, row.attempt, row.resumes, row.sandbox):
            return False
        if resume.requeue(self.settings, row.id, row.attempt, reason, expect_lease=row.lease_owner) is None:
            return True  # another reaper (or the worker itself) moved it first
        publish(self.celery, "run", row.id, row.attempt, node)  # the mark covers a failure
        lifecycle.clear_mark(self.db, row.id, row.attempt, "run")
        return True
