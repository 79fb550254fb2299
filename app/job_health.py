"""A job's health view (`GET /v1/jobs/<id>/health`, the job page, /metrics): `tasks.watch.health`'s
figures over the job's finished rollouts, plus the alerts the reaper raised.

The gateway keeps one `HealthCache` (`app.extensions`), so repeated reads of a running job
fetch only the rollouts finished since the last read.
"""

from __future__ import annotations

from typing import Any

from flask import current_app
from raas_client.health_models import HealthView
from sqlalchemy.orm import Session

from agents.job_config import JobConfig
from core.models import Job
from tasks.watch import health
from tasks.watch.health_alerts import alert_view, job_alerts

MAX_GROUPS = 200


def app_cache() -> health.HealthCache:
    """The gateway's health cache (made on first use)."""
    return current_app.extensions.setdefault("raas_health", health.HealthCache())


def health_view(s: Session, job: Job, cache: health.HealthCache | None = None) -> HealthView:
    """The job's health: overall, recent (what alerts judge), per weight version, series."""
    samples = (cache or health.HealthCache(jobs=1)).samples(s, job.id)
    config = JobConfig.load(job.config).health
    bucket, series = health.series(samples, config.window)
    return HealthView(
        job_id=job.id,
        window=config.window,
        overall=health.figures(samples),
        recent=health.figures(samples[-config.window :]),
        by_weight_version=health.by_weight_version(samples),
        groups=health.group_rewards(samples)[-MAX_GROUPS:],
        bucket=bucket,
        series=series,
        alerts=[alert_view(a) for a in job_alerts(s, job.id)],
    )


def health_payload(view: HealthView) -> dict[str, Any]:
    """The view as JSON (for templates)."""
    return view.model_dump(mode="json")
