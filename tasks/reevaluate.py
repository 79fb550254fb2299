"""Re-run EVAL of a stored rollout: the same grading code path, on the same stored artifact.

Runs on the shared `init` queue (any node can start a sandbox) and appends its result to the
rollout's `extra["reevaluations"]`; the rollout's own reward is never changed. Grading sandboxes
of re-evaluations live in their own state dir, away from the node reaper's sweep (which stops
sandboxes that belong to no live rollout attempt).
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from celery import shared_task
from sqlalchemy import select

from agents.job_config import JobConfig
from agents.registry import get_handler
from core.db import session_scope
from core.models import Job, Rollout, utcnow
from tasks.sandboxing import grading
from tasks.broker.config import PENDING_REEVALUATIONS, REEVALUATE_TASK
from tasks.contexts import eval_context, rollout_context

log = logging.getLogger(__name__)


def record(db_url: str, rollout_id: str, entry: dict[str, Any]) -> None:
    """Append one re-evaluation result under the rollout's row lock; its request is no longer
    pending."""
    with session_scope(db_url) as s:
        rollout = s.execute(select(Rollout).where(Rollout.id == rollout_id).with_for_update()).scalar_one()
        extra = dict(rollout.extra or {})
        extra["reevaluations"] = [*extra.get("reevaluations", []), entry]
        pending = [r for r in extra.pop(PENDING_REEVALUATIONS, []) if r != entry.get("request_id")]
        if pending:  # a request published twice (the drain) is graded twice, recorded twice
            extra[PENDING_REEVALUATIONS] = pending
        rollout.extra = extra


@shared_task(name=REEVALUATE_TASK, bind=True)
def reevaluate_task(self, rollout_id: str, request_id: str) -> None:
    """Grade the stored artifact of `rollout_id` again and record it under `request_id`."""
    settings = self.app.raas_settings
    with session_scope(settings.db_url) as s:
        rollout = s.get(Rollout, rollout_id)
        job = s.get(Job, rollout.job_id)
        s.expunge_all()
    entry: dict[str, Any] = {"request_id": request_id, "node": settings.node}
    try:
        from sandbox.handles import state_root
        from tasks.sandboxing.sandboxes import sandbox_settings

        handler = get_handler(job.agent)
        config = JobConfig.load(job.config)
        base = rollout_context(
            settings,
            rollout,
            job,
            handler,
            stage="eval",
            attempt=rollout.attempt,
            started=time.monotonic(),
            logger=log,
            config=config,
        )
        result = grading.grade(
            settings,
            handler,
            eval_context(base, rollout),
            job_sandbox=config.sandbox,
            label=(f"reevaluate-{rollout_id}", 0),
            workspace=settings.workspaces / f"reevaluate-{request_id}",
            state_dir=str(state_root(sandbox_settings(settings).state_dir) / "reevaluate"),
        )
        entry.update(
            reward=result.reward,
            metrics=result.metrics,
            extra={k: v for k, v in result.extra.items() if k not in ("git_patch", "test_output")},
        )
    except Exception as exc:
        log.exception("re-evaluation of %s failed", rollout_id)
        entry["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    entry["finished_at"] = utcnow().isoformat()
    record(settings.db_url, rollout_id, entry)
