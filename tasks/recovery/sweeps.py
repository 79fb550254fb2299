"""The reaper's sweeps: what hangs, waits unpublished, or is left behind on this node.

- stages running past their deadline plus grace while still beating (a hung hook): `timeout`;
- the publication outbox: rollouts a gateway committed but did not publish (it died in
  between) are published once they have waited `outbox_grace`;
- queued rollouts whose message may be lost (the broker restarted without persistence): when
  their queue is empty but the database says they wait, the message is published again —
  harmless if it was not lost, because the duplicate finds nothing to claim;
- sandboxes on this node whose rollout ended, moved on to another attempt, or is unknown,
  and starts whose starter was killed before the sandbox was ready (intent records); their
  workspaces go with them, as do workspace folders no live attempt owns;
- workspace checkpoints of rollouts that no longer wait for or run INIT or RUN
  (`tasks.sandboxing.checkpoints.sweep`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update

from agents.job_config import JobConfig
from core.db import session_scope
from core.models import Job, Outcome, Rollout, Status, utcnow
from core.settings import Settings
from tasks.writes import lifecycle, terminal
from tasks.broker import outbox
from tasks.sandboxing import checkpoints, sandboxes
from tasks.broker.config import STAGES as ACTIVE_STAGES
from tasks.broker.config import stage_queue
from tasks.broker.outbox import publish_many
from tasks.broker.publish import StageMessage


class Sweeps:
    """The reaper's sweeps (a part of `tasks.recovery.reaper.Reaper`, which sets these attributes)."""

    settings: Settings
    db: str
    celery: Any

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
            # a paused job's INIT-queued rows wait without a message on purpose (`tasks.writes.pauses`)
            or_(
                Rollout.status != Status.PENDING.value,
                ~select(Job.id).where(Job.id == Rollout.job_id, Job.paused_at.is_not(None)).exists(),
            ),
        ]
        with session_scope(self.db) as s:
            rows = s.execute(select(Rollout.status, Rollout.node).where(*waiting).distinct()).all()
        if not rows:
            return 0
        from tasks.broker.queues import queue_depths

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
            self.celery,
            (StageMessage(_stage(r.status), r.id, r.attempt, r.node, r.job_id, priority.get(r.job_id)) for r in taken),
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
            from sandbox.handles import orphaned, remove_stale_temps, state_root, unclaimed
        except ImportError:
            return 0
        try:  # half-written handles of starters killed mid-write
            remove_stale_temps(state_root(self.settings.sandbox_dir))
        except OSError:
            pass
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

    def sweep_checkpoints(self) -> int:
        """Remove the workspace checkpoints no resume can restore any more (ended rollouts,
        those in EVAL, unknown ones); how many rollouts' folders went."""
        return checkpoints.sweep(self.settings, self.db)

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
