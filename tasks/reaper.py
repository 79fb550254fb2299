"""The reaper: finds work whose worker, node or message is gone and puts it back on track.

Every pass is a handful of conditional UPDATEs, so any number of reapers may run at once
(one per node is the usual deployment). It handles:
- lost leases (no heartbeat for `lease_timeout`): a new attempt from INIT, or `infra_error`
  after `max_attempts`, because the sandbox of a lost node is gone with it;
- stages running past their deadline plus grace while still beating (a hung hook): `timeout`;
- queued rollouts whose message may be lost (the broker restarted without persistence): when
  their queue is empty but the database says they wait, the message is published again —
  harmless if it was not lost, because the duplicate finds nothing to claim;
- sandboxes on this node whose rollout ended, moved on to another attempt, or is unknown;
- the LLM server pool, every `LLM_MAINTENANCE_SECONDS`: health probes (a server marked down
  comes back when it answers) and in-flight counts recomputed from the rollouts in RUN
  (a killed worker never released its slot).
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import or_, select

from core.db import session_scope
from core.models import Job, Outcome, Rollout, Status, utcnow
from core.settings import Settings
from tasks import lifecycle, sandboxes
from tasks.config import stage_queue
from tasks.stages import DEFAULT_TIMEOUTS, publish

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

    def run_once(self) -> dict[str, int]:
        """One pass; returns how many rollouts each rule touched."""
        return {"lost": self.reclaim_lost(), "overdue": self.fail_overdue(),
                "requeued": self.republish_stale(), "sandboxes": self.sweep_sandboxes(),
                "llm_servers": self.maintain_llm_pool()}

    def maintain_llm_pool(self, force: bool = False) -> int:
        """Probe registered servers and repair in-flight counts; returns servers probed."""
        now = time.monotonic()
        if not force and now - self._llm_checked < LLM_MAINTENANCE_SECONDS:
            return 0
        self._llm_checked = now
        from tasks.llm_pool import check_health, reconcile_in_flight

        reconcile_in_flight(self.db)
        return len(check_health(self.db))

    def run_forever(self) -> None:
        """Reap every `reaper_interval` seconds until `stop()`."""
        while not self._stop.is_set():
            try:
                counts = self.run_once()
                if any(counts.values()):
                    log.info("reaper pass: %s", counts)
            except Exception:
                log.exception("reaper pass failed")
            self._stop.wait(self.settings.reaper_interval)

    def stop(self) -> None:
        """End `run_forever` after the current pass."""
        self._stop.set()

    def reclaim_lost(self) -> int:
        """New attempt (or infra_error) for leases whose holder stopped beating."""
        cutoff = utcnow() - timedelta(seconds=self.settings.lease_timeout)
        with session_scope(self.db) as s:
            rows = s.execute(select(Rollout.id, Rollout.lease_owner, Rollout.attempt,
                                    Rollout.sandbox, Rollout.status)
                             .where(Rollout.status.in_(ACTIVE_STAGES),
                                    Rollout.lease_owner.is_not(None),
                                    Rollout.heartbeat_at < cutoff)).all()
        for row in rows:
            reason = f"{row.status}: worker {row.lease_owner} stopped beating"
            if row.attempt >= self.settings.max_attempts:
                done = lifecycle.finish(self.db, row.id, Status.FAILED,
                                        Outcome.INFRA_ERROR.value, lease=row.lease_owner,
                                        error=reason)
            else:
                new = lifecycle.retry(self.db, row.id, expect_lease=row.lease_owner,
                                      error=reason)
                done = new is not None
                if done:
                    publish(self.celery, "init", row.id, new)
            if done:
                log.warning("rollout %s: %s", row.id, reason)
                if row.sandbox and row.sandbox.get("node", self.settings.node) == self.settings.node:
                    sandboxes.release(row.sandbox)
        return len(rows)

    def fail_overdue(self) -> int:
        """`timeout` for stages still beating long after their deadline (hung hooks)."""
        with session_scope(self.db) as s:
            rows = s.execute(select(Rollout.id, Rollout.lease_owner, Rollout.status,
                                    Rollout.stage_started_at, Job.config)
                             .join(Job, Job.id == Rollout.job_id)
                             .where(Rollout.status.in_(ACTIVE_STAGES),
                                    Rollout.lease_owner.is_not(None))).all()
        n = 0
        for row in rows:
            limit = float((row.config or {}).get("limits", {}).get(f"{row.status}_timeout")
                          or DEFAULT_TIMEOUTS[row.status])
            age = lifecycle.seconds_since(row.stage_started_at) or 0
            if age > limit + self.settings.stage_grace and lifecycle.finish(
                    self.db, row.id, Status.FAILED, Outcome.TIMEOUT.value,
                    lease=row.lease_owner, error=f"{row.status}: hung past its deadline"):
                n += 1
        return n

    def republish_stale(self) -> int:
        """Publish again what waits in the database but not in an empty queue."""
        cutoff = utcnow() - timedelta(seconds=self.settings.requeue_after)
        with session_scope(self.db) as s:
            rows = s.execute(select(Rollout.id, Rollout.attempt, Rollout.status, Rollout.node)
                             .where(Rollout.lease_owner.is_(None),
                                    or_(Rollout.status == Status.PENDING.value,
                                        Rollout.status.in_(["run", "eval"])),
                                    Rollout.queued_at < cutoff)).all()
        if not rows:
            return 0
        from tasks.queues import queue_depths

        stage_of = {r.id: ("init" if r.status == Status.PENDING.value else r.status) for r in rows}
        queues = {stage_queue(stage_of[r.id], r.node) for r in rows}
        depths = queue_depths(self.celery, sorted(queues))
        n = 0
        for r in rows:
            stage = stage_of[r.id]
            if depths.get(stage_queue(stage, r.node), 0) == 0 and lifecycle.touch_queued(
                    self.db, r.id, r.attempt, r.status):
                publish(self.celery, stage, r.id, r.attempt, r.node)
                n += 1
        return n

    def sweep_sandboxes(self) -> int:
        """Stop sandboxes on this node that no live rollout attempt owns."""
        try:
            from sandbox import list_sandboxes
        except ImportError:
            return 0
        # Only sandboxes of this deployment: their workspaces live under our workspace root.
        # Another raas (or a re-evaluation) on the same node is none of our business.
        root = str(self.settings.workspaces) + "/"
        handles = [h for h in list_sandboxes(self.settings.sandbox_dir)
                   if str(h.get("workspace", "")).startswith(root)]
        if not handles:
            return 0
        wanted = {}
        for h in handles:
            rid, _, attempt = (h.get("label") or "").partition(":")
            wanted[h.get("label")] = (rid, attempt)
        with session_scope(self.db) as s:
            live = {f"{r.id}:{r.attempt}" for r in s.execute(
                select(Rollout.id, Rollout.attempt).where(
                    Rollout.id.in_([rid for rid, _ in wanted.values()]),
                    Rollout.status.in_(ACTIVE_STAGES)))}
        n = 0
        for h in handles:
            if h.get("label") not in live:
                sandboxes.release(h)
                n += 1
        return n
