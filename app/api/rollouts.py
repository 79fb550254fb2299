"""v1 rollouts: one rollout with its turns."""
from __future__ import annotations

from flask import Blueprint, current_app, g, request
from sqlalchemy import select

from app.api.routing import typed_route
from app.db import session_scope
from app.errors import NotFound
from app.jobs import rollout_view
from app.models import Job, Rollout, Turn
from app.schemas import RolloutView

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
