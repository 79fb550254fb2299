"""What the ProRL-compatible routes (`app/api/prorl.py`) read and write in the database: the
service's started state (a `service_flags` row, so every gateway process agrees on it), the
wait of `/process` for its rollout, the jobs `/process` created (by ProRL `job_id`), and the
numbers of `/status`.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.context import POLL_SECONDS
from core.db import session_scope
from core.errors import StageTimeout
from core.models import TERMINAL_VALUES, Job, LLMServer, Rollout, ServiceFlag, Turn, utcnow

RUNNING_FLAG = "prorl_running"


def is_running(db_url: str) -> bool:
    """ProRL's started/stopped state."""
    with session_scope(db_url) as s:
        flag = s.get(ServiceFlag, RUNNING_FLAG)
        return bool(flag and flag.enabled)


def set_running(db_url: str, value: bool) -> bool:
    """Switch the state; False when it already was `value` (one UPDATE decides races)."""
    with session_scope(db_url) as s:
        changed = s.execute(
            update(ServiceFlag)
            .where(ServiceFlag.name == RUNNING_FLAG, ServiceFlag.enabled.is_not(value))
            .values(enabled=value, updated_at=utcnow())
        ).rowcount
        if changed or s.get(ServiceFlag, RUNNING_FLAG) is not None:
            return bool(changed)
    try:
        with session_scope(db_url) as s:
            s.add(ServiceFlag(name=RUNNING_FLAG, enabled=value))
        return True
    except IntegrityError:  # another gateway created it first
        return set_running(db_url, value)


def wait_terminal(db_url: str, rollout_id: str, max_wait: float) -> tuple[Rollout, list[Turn]]:
    """The rollout once it ended, with its current attempt's turns; StageTimeout after
    `max_wait` seconds."""
    deadline = time.monotonic() + max_wait
    while True:
        with session_scope(db_url) as s:
            r = s.get(Rollout, rollout_id)
            if r.status in TERMINAL_VALUES:
                turns = s.scalars(
                    select(Turn).where(Turn.rollout_id == r.id, Turn.attempt == r.attempt).order_by(Turn.index)
                ).all()
                s.expunge_all()
                return r, list(turns)
        if time.monotonic() > deadline:
            raise StageTimeout("Processing timed out")
        time.sleep(POLL_SECONDS)


def _prorl_jobs(s: Session, job_id: str | None = None, unfinished: bool = False, owner: str | None = None) -> list[str]:
    tag = Job.config[("labels", "prorl_job_id")].as_string()
    q = select(Job.id).where(tag == job_id if job_id is not None else tag.is_not(None))
    if owner is not None:
        q = q.where(Job.owner == owner)
    if unfinished:
        q = q.where(Job.id.in_(select(Rollout.job_id).where(Rollout.status.not_in(TERMINAL_VALUES))))
    return list(s.scalars(q).all())


def prorl_jobs(db_url: str, job_id: str | None = None, unfinished: bool = False, owner: str | None = None) -> list[str]:
    """Ids of jobs created by /process (with ProRL job id `job_id`, of `owner` if given,
    still running if `unfinished`)."""
    with session_scope(db_url) as s:
        return _prorl_jobs(s, job_id, unfinished, owner)


def prorl_status(db_url: str, owner: str) -> dict[str, Any]:
    """The owner's LLM servers and the number of their /process rollouts still running."""
    with session_scope(db_url) as s:
        servers = [
            {"address": u, "healthy": h, "in_flight": n}
            for u, h, n in s.execute(
                select(LLMServer.url, LLMServer.healthy, LLMServer.in_flight).where(LLMServer.owner == owner)
            )
        ]
        pending = s.scalar(
            select(func.count())
            .select_from(Rollout)
            .where(
                Rollout.status.not_in(TERMINAL_VALUES),
                Rollout.job_id.in_(
                    select(Job.id).where(
                        Job.owner == owner, Job.config[("labels", "prorl_job_id")].as_string().is_not(None)
                    )
                ),
            )
        )
    return {"pending_jobs": pending, "llm_servers": servers}
