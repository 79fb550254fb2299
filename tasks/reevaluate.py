"""Re-run EVAL of a stored rollout in a fresh sandbox (e.g. a SWE patch after a test fix).

Runs on the shared `init` queue (any node can start a sandbox) and appends its result to the
rollout's `extra["reevaluations"]`; the rollout's own reward is never changed.
"""
from __future__ import annotations

import logging
import traceback
from typing import Any

from celery import shared_task
from sqlalchemy import select

from agents.registry import get_handler
from core.db import session_scope
from core.models import Job, Rollout, utcnow
from tasks.config import REEVALUATE_TASK
from tasks.sandboxes import sandbox_settings, wanted_runtime

log = logging.getLogger(__name__)


def supports_reevaluation(agent: str) -> bool:
    """True when the agent's handler can grade a stored result again."""
    return callable(getattr(get_handler(agent), "reevaluate", None))


def record(db_url: str, rollout_id: str, entry: dict[str, Any]) -> None:
    """Append one re-evaluation result under the rollout's row lock."""
    with session_scope(db_url) as s:
        rollout = s.execute(select(Rollout).where(Rollout.id == rollout_id)
                            .with_for_update()).scalar_one()
        extra = dict(rollout.extra or {})
        extra["reevaluations"] = [*extra.get("reevaluations", []), entry]
        rollout.extra = extra


@shared_task(name=REEVALUATE_TASK, bind=True)
def reevaluate_task(self, rollout_id: str, request_id: str) -> None:
    """Grade the stored result of `rollout_id` again and record it under `request_id`."""
    settings = self.app.raas_settings
    with session_scope(settings.db_url) as s:
        rollout = s.get(Rollout, rollout_id)
        job = s.get(Job, rollout.job_id)
        instance, extra, config = rollout.instance, dict(rollout.extra or {}), job.config or {}
        agent = job.agent
    entry: dict[str, Any] = {"request_id": request_id, "node": settings.node}
    try:
        handler = get_handler(agent)
        options = config.get("sandbox") or {}
        result = handler.reevaluate(
            instance, extra.get("git_patch"), agent_config=config.get("agent_config"),
            sandbox_options=options,
            runtime=wanted_runtime(settings, options, handler.needs_sandbox),
            workspace_root=str(settings.workspaces), sandbox_settings=sandbox_settings(settings))
        entry.update(reward=result.reward, metrics=result.metrics,
                     extra={k: v for k, v in result.extra.items() if k != "git_patch"})
    except Exception as exc:
        log.exception("re-evaluation of %s failed", rollout_id)
        entry["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    entry["finished_at"] = utcnow().isoformat()
    record(settings.db_url, rollout_id, entry)
