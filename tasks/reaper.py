"""The reaper: finds work whose worker, node or message is gone and puts it back on track.

Every pass is a handful of conditional UPDATEs, so any number of reapers may run at once
(one per node is the usual deployment). It handles:
- lost leases (no heartbeat for `lease_timeout`): a RUN whose sandbox still answers on this
  node continues in it from its logged turns, a lost EVAL grades its stored artifact again
  (`tasks.resume`; work of another node is left to that node's reaper for a second lease
  time); anything else gets a new attempt from INIT, or `infra_error` after `max_attempts`;
- stages running past their deadline plus grace while still beating (a hung hook): `timeout`;
- the publication outbox: rollouts a gateway committed but did not publish (it died in
  between) are published once they have waited `outbox_grace`;
- rollouts abandoned by their node (`reroute_abandoned`): a node whose reaper and workers
  all stopped beating for `node_timeout` is dead, and a queue of a live node whose consumers
  all stopped beating is as good as dead; what waits there or is leased there and waits for
  EVAL moves to a live node's EVAL queue (its artifact is stored: `tasks.handback`), the rest
  gets a new attempt from INIT on a live node (bounded by `max_attempts`), instead of a
  re-publish into a queue nobody reads;
- queued rollouts whose message may be lost (the broker restarted without persistence): when
  their queue is empty but the database says they wait, the message is published again —
  harmless if it was not lost, because the duplicate finds nothing to claim;
- sandboxes on this node whose rollout ended, moved on to another attempt, or is unknown,
  and starts whose starter was killed before the sandbox was ready (intent records); their
  workspaces go with them, as do workspace folders no live attempt owns;
- the LLM server pool, every `LLM_MAINTENANCE_SECONDS`: health probes (a server marked down
  comes back when it answers) and in-flight counts recomputed from the rollouts in RUN
  (a killed worker never released its slot).

Every rule acts on a row through a conditional UPDATE fenced on what it observed (the lease,
or attempt + status + node of a queued row), so two reapers running the same pass at once
never both retry or re-publish a row. A reaper beats its node's row every pass; its start-up
pass stops the node's stale sandboxes first (a node coming back after it was judged dead
holds sandboxes of attempts that restarted elsewhere).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, false, or_, select, update

from agents.job_config import JobConfig
from core.db import session_scope
from core.models import Job, Outcome, Rollout, Status, utcnow
from core.settings import Settings
from tasks import groups, handback, lifecycle, nodes, outbox, resume, sandboxes, terminal
from tasks.callbacks import CallbackDispatcher
from tasks.config import stage_queue
from tasks.db_retry import is_disconnect
from tasks.outbox import publish_many
from tasks.stages import publish

log = logging.getLogger(__name__)
ACTIVE_STAGES = ["init", "run", "eval"]
LLM_MAINTENANCE_SECONDS = 60.0


class Reaper:
    """One reaper loop for `settings`; `run_once` is what tests call."""

    def __init__(self, settings: Settings, celery: Any) -> None:
        self.settings = settings
        self.db = settings.db_url
        self.celery = celery
        self._stop = threading.Event()
        self._llm_checked = 0.0
        self._watching_since: float | None = None  # start of this reaper's unbroken view
        self._last_beat = 0.0
        self._db_lost = False  # the last pass could not reach the database
        self._db_back_at: float | None = None  # monotonic time it answered again
        self._callbacks: CallbackDispatcher | None = None

    def start_up(self) -> int:
        """The first pass of a (re)started reaper: stop this node's stale sandboxes, then say
        the node is alive; returns sandboxes stopped."""
        stopped = self.sweep_sandboxes()
        nodes.beat_node(self.db, self.settings.node, started=True)
        if stopped:
            log.warning("node %s start-up: stopped %s stale sandbox(es)", self.settings.node, stopped)
        return stopped

    def run_once(self) -> dict[str, int]:
        """One pass; returns how many rollouts each rule touched."""
        nodes.beat_node(self.db, self.settings.node)
        self._saw_database()
        nodes.prune_consumers(self.db, self.settings.node_timeout)
        return {
            "lost": self.reclaim_lost(),
            "overdue": self.fail_overdue(),
            "abandoned": self.reroute_abandoned() if self._watched_long_enough() else 0,
            "outbox": self.drain_outbox(),
            "requeued": self.republish_stale(),
            "group_deadlines": len(groups.close_overdue(self.db)),
            "sandboxes": self.sweep_sandboxes(),
            "llm_servers": self.maintain_llm_pool(),
        }

    def _saw_database(self) -> None:
        """Note a successful beat; a gap (the database was away, or this reaper just started)
        restarts the reaper's view of who is alive."""
        now = time.monotonic()
        gap = max(3 * self.settings.reaper_interval, self.settings.node_timeout / 4)
        if self._watching_since is None or now - self._last_beat > gap:
            self._watching_since = now
        self._last_beat = now

    def _watched_long_enough(self) -> bool:
        """Judge nodes only after watching them for `node_timeout` without a gap: after a
        database outage every node's rows are stale, none of them is dead."""
        return (
            self._watching_since is not None and time.monotonic() - self._watching_since >= self.settings.node_timeout
        )

    def maintain_llm_pool(self, force: bool = False) -> int:
        """Probe registered servers and repair in-flight counts; returns servers probed."""
        now = time.monotonic()
        if not force and now - self._llm_checked < LLM_MAINTENANCE_SECONDS:
            return 0
        self._llm_checked = now
        from tasks.llm_pool import check_health, reconcile_in_flight

        reconcile_in_flight(self.db)
        return len(check_health(self.db, self.settings))

    def run_forever(self) -> None:
        """Reap every `reaper_interval` seconds until `stop()` (after the start-up pass).

        The callback dispatcher runs beside it in its own thread: a slow callback endpoint
        never delays a pass."""
        self._callbacks = CallbackDispatcher(self.settings).start()
        while not self._stop.is_set():
            try:
                self.start_up()
                break
            except Exception:
                log.exception("reaper start-up pass failed")
                self._stop.wait(self.settings.reaper_interval)
        while not self._stop.is_set():
            try:
                if self._db_lost:
                    self._database_is_back()  # raises while it is still down
                counts = self.run_once()
                if any(counts.values()):
                    log.info("reaper pass: %s", counts)
            except Exception as exc:
                self._db_lost = self._db_lost or is_disconnect(exc)
                log.exception("reaper pass failed")
            self._stop.wait(self.settings.reaper_interval)

    def _database_is_back(self) -> None:
        """After passes that could not reach the database: probe it, and once it answers
        start the lease time during which no lease is judged lost (`reclaim_lost`)."""
        with session_scope(self.db) as s:
            s.execute(select(1))
        self._db_lost, self._db_back_at = False, time.monotonic()
        log.warning(
            "reaper: the database answers again; no lease is judged lost for %.0fs (workers could not beat meanwhile)",
            self.settings.lease_timeout,
        )

    def stop(self) -> None:
        """End `run_forever` after the current pass (and the callback dispatcher)."""
        self._stop.set()
        if self._callbacks is not None:
            self._callbacks.stop()

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
        if handback.eval_node(self.settings, exclude=None, cached=False) is None:
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

    def fail_overdue(self) -> int:
        """`timeout` for stages still beating long after their deadline (hung hooks); the
        seconds a RUN waited on a paused pool extend its deadline."""
        with session_scope(self.db) as s:
            rows = s.execute(
                select(
                    Rollout.id,
                    Rollout.lease_owner,
                    Rollout.status,
                    Rollout.stage_started_at,
                    Rollout.paused_seconds,
                    Job.config,
                )
                .join(Job, Job.id == Rollout.job_id)
                .where(Rollout.status.in_(ACTIVE_STAGES), Rollout.lease_owner.is_not(None))
            ).all()
        n = 0
        for row in rows:
            limit = JobConfig.load(row.config).limits.stage_timeout(row.status)
            # Time spent waiting on a paused pool (a weight push) is not the stage's.
            age = (lifecycle.seconds_since(row.stage_started_at) or 0) - (row.paused_seconds or 0)
            if age > limit + self.settings.stage_grace and terminal.finish(
                self.db,
                row.id,
                Status.FAILED,
                Outcome.TIMEOUT.value,
                lease=row.lease_owner,
                error=f"{row.status}: hung past its deadline",
            ):
                n += 1
        return n

    def republish_stale(self) -> int:
        """Publish again what waits in the database but not in an empty queue (one batch)."""
        cutoff = utcnow() - timedelta(seconds=self.settings.requeue_after)
        waiting = [
            Rollout.lease_owner.is_(None),
            Rollout.outbox_at.is_(None),
            Rollout.status.in_([Status.PENDING.value, "run", "eval"]),
            Rollout.queued_at < cutoff,
        ]
        with session_scope(self.db) as s:
            rows = s.execute(select(Rollout.status, Rollout.node).where(*waiting).distinct()).all()
        if not rows:
            return 0
        from tasks.queues import queue_depths

        queue_of = {(r.status, r.node): stage_queue(_stage(r.status), r.node) for r in rows}
        depths = queue_depths(self.celery, sorted(set(queue_of.values())))
        empty = [key for key, queue in queue_of.items() if depths.get(queue, 0) == 0]
        if not empty:
            return 0
        # Restart their queued clocks in one statement (one reaper wins each row), then
        # publish what this reaper took in one batch.
        with session_scope(self.db) as s:
            taken = s.execute(
                update(Rollout)
                .where(
                    *waiting,
                    or_(
                        *[
                            and_(
                                Rollout.status == status,
                                Rollout.node.is_(None) if node is None else Rollout.node == node,
                            )
                            for status, node in empty
                        ]
                    ),
                )
                .values(queued_at=utcnow())
                .returning(Rollout.id, Rollout.attempt, Rollout.status, Rollout.node, Rollout.job_id),
                execution_options={"synchronize_session": False},
            ).all()
        priority = outbox.job_priorities(self.db, {r.job_id for r in taken}) if taken else {}
        publish_many(
            self.celery, ((_stage(r.status), r.id, r.attempt, r.node, r.job_id, priority.get(r.job_id)) for r in taken)
        )
        return len(taken)

    def drain_outbox(self) -> int:
        """Publish rollouts (and re-evaluation requests) a gateway committed but never
        published (it died in between)."""
        grace = self.settings.outbox_grace
        return outbox.drain(self.db, self.celery, grace) + outbox.drain_reevaluations(self.db, self.celery, grace)

    def sweep_sandboxes(self) -> int:
        """Stop sandboxes on this node that no live rollout attempt owns, and starts whose
        starter died before they were ready; delete their workspaces, and workspace folders
        that no live attempt owns (a starter killed before its intent record). Returns how
        many sandboxes were stopped."""
        try:
            from sandbox import list_sandboxes
            from sandbox.handles import orphaned, unclaimed
        except ImportError:
            return 0
        # Only sandboxes of this deployment: their workspaces live under our workspace root.
        # Another raas (or a re-evaluation) on the same node is none of our business.
        root = str(self.settings.workspaces) + "/"
        handles = [
            h
            for h in list_sandboxes(self.settings.sandbox_dir, include_dead=True)
            if str(h.get("workspace", "")).startswith(root)
        ]
        folders = sandboxes.attempt_folders(self.settings)  # listed before the query below
        if not handles and not folders:
            return 0
        # Warm-pool members nobody claimed belong to their pool's process while it lives.
        labels = {h.get("label") or "" for h in handles if not unclaimed(h)} | set(folders.values())
        labels.discard("")
        live = self._live_attempts(labels) if labels else set()
        n, kept = 0, set()
        for h in handles:
            if orphaned(h) or (not unclaimed(h) and h.get("label") not in live):
                sandboxes.release(h)
                n += 1
            else:
                kept.add(h.get("workspace"))
        for path, label in folders.items():
            if label not in live and path not in kept:
                sandboxes.remove_workspace(path)
        return n

    def _live_attempts(self, labels: set[str]) -> set[str]:
        """Those of the "<rollout>:<attempt>" labels whose attempt is in a stage now."""
        ids = {label.partition(":")[0] for label in labels}
        with session_scope(self.db) as s:
            return {
                f"{r.id}:{r.attempt}"
                for r in s.execute(
                    select(Rollout.id, Rollout.attempt).where(
                        Rollout.id.in_(sorted(ids)), Rollout.status.in_(ACTIVE_STAGES)
                    )
                )
            }


def _stage(status: str) -> str:
    """The stage a queued rollout waits for (pending rollouts wait for INIT)."""
    return "init" if status == Status.PENDING.value else status
