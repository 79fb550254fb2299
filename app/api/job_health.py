"""v1 job health: live figures of a job's rollouts and the alerts its thresholds raised."""

from __future__ import annotations

from flask import Blueprint, current_app, g
from raas_client.health_models import HealthView

from app.api.routing import typed_route
from app.job_health import app_cache, health_view
from app.jobs import get_job
from core.db import session_scope
from tasks.watch.health_alerts import check_job

bp = Blueprint("job_health", __name__)


@typed_route(
    bp,
    "/v1/jobs/<job_id>/health",
    "GET",
    response=HealthView,
    summary="A job's live health: parse failures, truncation, turns, reward without tools, infra; alerts",
)
def job_health(job_id: str) -> HealthView:
    db_url = current_app.config["RAAS"].db_url
    with session_scope(db_url) as s:
        get_job(s, job_id, g.owner)
    check_job(db_url, job_id, app_cache())  # judged on read too: what it shows is up to date
    with session_scope(db_url) as s:
        return health_view(s, get_job(s, job_id, g.owner), app_cache())
