"""Rollout service: one rollout (owned by the caller) with its turns, and re-evaluation requests.

The routes of `app/api/rollouts.py` and the dashboard's rollout pages read through here, so the
ownership rule (another tenant's rollout is "not found") and the turn order are written once.
A re-evaluation request goes through the publication outbox: it is committed with the
rollout's outbox mark before it is published, so an accepted request is never lost to a broker
that is away (the reaper's drain publishes it).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.jobs import rollout_view
from app.schemas import RolloutView
from core.db import session_scope
from core.errors import Conflict, InvalidRequest, NotFound
from core.models import Job, Rollout, Status, Turn
from core.settings import Settings
from tasks.broker import outbox

REEVALUATION_POLL = 0.2  # seconds between two looks for a re-evaluation's result


def owned_rollout(s: Session, rollout_id: str, owner: str) -> tuple[Rollout, Job]:
    """The rollout and its job, or NotFound when there is none or another owner's."""
    r = s.get(Rollout, rollout_id)
    job = s.get(Job, r.job_id) if r is not None else None
    if r is None or job.owner != owner:
        raise NotFound(f"rollout {rollout_id!r} not found")
    return r, job


def rollout_turns(s: Session, rollout_id: str) -> list[Turn]:
    """Every logged turn of the rollout, all attempts, in attempt and turn order."""
    return list(
        s.scalars(select(Turn).where(Turn.rollout_id == rollout_id).order_by(Turn.attempt, Turn.index, Turn.id)).all()
    )


def show_rollout(db_url: str, rollout_id: str, owner: str, with_turns: bool) -> RolloutView:
    """The wire form of one of the owner's rollouts, with its turns if asked."""
    with session_scope(db_url) as s:
        r, _job = owned_rollout(s, rollout_id, owner)
        return rollout_view(r, rollout_turns(s, rollout_id) if with_turns else None)


def current_turns(s: Session, r: Rollout) -> tuple[list[Turn], int]:
    """The turns of the rollout's current attempt, and how many earlier attempts logged."""
    rows = rollout_turns(s, r.id)
    current = [t for t in rows if t.attempt == r.attempt]
    return current, len(rows) - len(current)


def request_reevaluation(settings: Settings, celery: Any, rollout_id: str, owner: str) -> str:
    """Accept a re-evaluation of a done rollout's stored artifact; returns the request id.

    The request commits with an outbox mark, then is published; a publish that fails is left
    to the reaper's outbox drain (the request was accepted either way)."""
    request_id = uuid.uuid4().hex
    with session_scope(settings.db_url) as s:
        r, _job = owned_rollout(s, rollout_id, owner)
        s.refresh(r, with_for_update=True)  # one request at a time appends to `extra`
        if r.status != Status.DONE.value:
            raise Conflict(f"rollout {rollout_id!r} is {r.status}; only done rollouts can be re-evaluated")
        if r.artifact is None:
            raise InvalidRequest(
                f"rollout {rollout_id!r} has no stored artifact to grade "
                "(it ended before RUN finished, or predates artifacts)"
            )
        mark = outbox.mark_reevaluation(r, request_id)
    try:
        outbox.publish_reevaluation(settings.db_url, celery, rollout_id, request_id, mark)
    except Exception:  # noqa: BLE001 - the mark stays: the reaper publishes it after the grace
        pass
    return request_id


def reevaluation_result(db_url: str, rollout_id: str, request_id: str, wait: float) -> RolloutView:
    """The rollout once the request's result is recorded, or after `wait` seconds; its
    `extra.reevaluation_request` names the request either way."""
    deadline = time.monotonic() + wait
    while True:
        with session_scope(db_url) as s:
            r = s.get(Rollout, rollout_id)
            done = any(e.get("request_id") == request_id for e in (r.extra or {}).get("reevaluations", []))
            if done or time.monotonic() >= deadline:
                view = rollout_view(r)
                view.extra = {**view.extra, "reevaluation_request": request_id}
                return view
        time.sleep(REEVALUATION_POLL)


def job_rollout_rows(s: Session, job_id: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """The named columns of every rollout of a job, one dict per rollout (the job page's
    charts)."""
    cols = [getattr(Rollout, c) for c in columns]
    return [dict(zip(columns, row)) for row in s.execute(select(*cols).where(Rollout.job_id == job_id))]
