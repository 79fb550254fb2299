"""v1 rollouts: one rollout with its turns; re-evaluation of a stored result; branches."""

from __future__ import annotations

from flask import Blueprint, current_app, g, request

from app.api.routing import query_number, typed_route
from app.branches import create_branches, list_branches
from app.context import gateway_settings
from app.rollouts import reevaluation_result, request_reevaluation, show_rollout
from app.schemas import BranchCreate, BranchesAccepted, BranchList, RolloutView

bp = Blueprint("rollouts", __name__)


@typed_route(
    bp,
    "/v1/rollouts/<rollout_id>",
    "GET",
    response=RolloutView,
    summary="A rollout with its turns",
    query={"turns": "include turns (default 1)"},
)
def show(rollout_id: str) -> RolloutView:
    return show_rollout(
        gateway_settings().db_url, rollout_id, g.owner, with_turns=request.args.get("turns", "1") != "0"
    )


@typed_route(
    bp,
    "/v1/rollouts/<rollout_id>/reevaluate",
    "POST",
    response=RolloutView,
    status=202,
    summary="Re-run EVAL (the same grading path) on the stored artifact",
    query={"wait": "seconds to wait for the new result (default 0)"},
)
def reevaluate(rollout_id: str) -> RolloutView:
    settings = gateway_settings()
    wait = query_number("wait", 0, minimum=0, maximum=settings.results_max_wait * 10, integer=False)
    request_id = request_reevaluation(settings, current_app.extensions["celery"], rollout_id, g.owner)
    return reevaluation_result(settings.db_url, rollout_id, request_id, wait)


@typed_route(
    bp,
    "/v1/rollouts/<rollout_id>/branches",
    "POST",
    body=BranchCreate,
    response=BranchesAccepted,
    status=202,
    summary="Start n continuations of the rollout after its turn k (one child job; app/branches.py)",
)
def branch(rollout_id: str, body: BranchCreate) -> BranchesAccepted:
    return create_branches(gateway_settings(), rollout_id, body, g.owner, current_app.extensions["celery"])


@typed_route(
    bp,
    "/v1/rollouts/<rollout_id>/branches",
    "GET",
    response=BranchList,
    summary="Every branch of the rollout, by turn (without turns)",
)
def branches(rollout_id: str) -> BranchList:
    return list_branches(gateway_settings().db_url, rollout_id, g.owner)
