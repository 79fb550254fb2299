"""v1 rollouts: one rollout with its turns; re-evaluation of a stored result."""
from __future__ import annotations

import time
import uuid

from flask import Blueprint, current_app, g, request
from sqlalchemy import select

from app.api.routing import query_number, typed_route
from app.jobs import rollout_view
from app.schemas import RolloutView
from core.db import session_scope
from core.errors import Conflict, InvalidRequest, NotFound
from core.models import Job, Rollout, Turn
from tasks.config import REEVALUATE_TASK

bp = Blueprint("rollouts", __name__)


@typed_route(bp, "/v1/rollouts/<rollout_id>", "GET", response=RolloutView,
             summary="A rollout with its turns", query={"turns": "include turns (default 1)"})
def show(rollout_id: str) -> RolloutView:
    with session_scope(current_app.config["RAAS"].db_url) as s:
        r = s.get(Rollout, rollout_id)
        if r is None or s.scalar(select(Job.owner).where(Job.id == r.job_id)) != g.owner:
            raise NotFound(f"rollout {rollout_id!r} not found")
        turns = None
        if request.args.get("turns", "1") != "0":
            turns = s.scalars(select(Turn).where(Turn.rollout_id == rollout_id)
                              .order_by(Turn.attempt, Turn.index, Turn.id)).all()
        return rollout_view(r, list(turns) if turns is not None else None)


@typed_route(bp, "/v1/rollouts/<rollout_id>/reevaluate", "POST", response=RolloutView,
             status=202, summary="Re-run EVAL (the same grading path) on the stored artifact",
             query={"wait": "seconds to wait for the new result (default 0)"})
def reevaluate(rollout_id: str) -> RolloutView:
    settings = current_app.config["RAAS"]
    wait = query_number("wait", 0, minimum=0, maximum=settings.results_max_wait * 10,
                        integer=False)
    with session_scope(settings.db_url) as s:
        r = s.get(Rollout, rollout_id)
        job = s.get(Job, r.job_id) if r is not None else None
        if r is None or job.owner != g.owner:
            raise NotFound(f"rollout {rollout_id!r} not found")
        if r.status != "done":
            raise Conflict(f"rollout {rollout_id!r} is {r.status}; only done rollouts can be "
                           "re-evaluated")
        if r.artifact is None:
            raise InvalidRequest(f"rollout {rollout_id!r} has no stored artifact to grade "
                                 "(it ended before RUN finished, or predates artifacts)")
    request_id = uuid.uuid4().hex
    current_app.extensions["celery"].send_task(REEVALUATE_TASK, args=[rollout_id, request_id])
    deadline = time.monotonic() + wait
    while True:
        with session_scope(settings.db_url) as s:
            r = s.get(Rollout, rollout_id)
            done = any(e.get("request_id") == request_id
                       for e in (r.extra or {}).get("reevaluations", []))
            if done or time.monotonic() >= deadline:
                view = rollout_view(r)
                view.extra = {**view.extra, "reevaluation_request": request_id}
                return view
        time.sleep(0.2)
