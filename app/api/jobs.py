"""v1 jobs: submit, inspect, page results (long-poll or NDJSON stream), cancel, pause, resume."""

from __future__ import annotations

import json
import time

from flask import Blueprint, Response, current_app, g, request, stream_with_context

from app.api.routing import query_number, typed_route
from app.context import POLL_SECONDS, gateway_settings
from app.jobs import cancel_job, create_job, get_job, job_view, owner_jobs, pause_job, results_after, resume_job
from app.schemas import JobAccepted, JobCreate, JobList, JobView, ResultsPage
from core.db import session_scope
from core.errors import InvalidRequest

bp = Blueprint("jobs", __name__)


@typed_route(
    bp,
    "/v1/jobs",
    "POST",
    body=JobCreate,
    response=JobAccepted,
    status=202,
    summary="Submit a batch: every instance n_samples times",
)
def submit(body: JobCreate) -> JobAccepted:
    return create_job(gateway_settings(), body, g.owner, current_app.extensions["celery"], admin=g.admin)


@typed_route(
    bp,
    "/v1/jobs",
    "GET",
    response=JobList,
    summary="List jobs, newest first",
    query={
        "limit": "page size (1-500)",
        "before": "cursor from the previous page",
        "prefix": "only jobs whose id starts with it (a short id)",
    },
)
def list_jobs() -> JobList:
    limit = int(query_number("limit", 50, minimum=1, maximum=500))
    before = request.args.get("before")
    prefix = request.args.get("prefix") or None
    if prefix is not None and len(prefix) > 256:
        raise InvalidRequest("prefix: longer than a job id", field="prefix")
    with session_scope(gateway_settings().db_url) as s:
        views = owner_jobs(s, g.owner, before, limit, prefix)
    return JobList(jobs=views, next_cursor=views[-1].job_id if len(views) == limit else None)


@typed_route(bp, "/v1/jobs/<job_id>", "GET", response=JobView, summary="A job's progress")
def show(job_id: str) -> JobView:
    with session_scope(gateway_settings().db_url) as s:
        return job_view(s, get_job(s, job_id, g.owner))


@typed_route(
    bp,
    "/v1/jobs/<job_id>/cancel",
    "POST",
    response=JobView,
    summary="Cancel: queued rollouts never start, running ones stop at the next turn",
)
def cancel(job_id: str) -> JobView:
    return cancel_job(gateway_settings(), job_id, g.owner, current_app.extensions["celery"])


@typed_route(
    bp,
    "/v1/jobs/<job_id>/pause",
    "POST",
    response=JobView,
    summary="Pause: queued rollouts wait unclaimed until resume, started ones finish",
)
def pause(job_id: str) -> JobView:
    return pause_job(gateway_settings(), job_id, g.owner, current_app.extensions["celery"])


@typed_route(
    bp,
    "/v1/jobs/<job_id>/resume",
    "POST",
    response=JobView,
    summary="Resume a paused job: its waiting rollouts are queued again",
)
def resume(job_id: str) -> JobView:
    return resume_job(gateway_settings(), job_id, g.owner, current_app.extensions["celery"])


@typed_route(
    bp,
    "/v1/jobs/<job_id>/results",
    "GET",
    response=ResultsPage,
    summary="Finished rollouts after a cursor, in completion order (long-poll)",
    query={
        "after": "cursor (0 = from the start)",
        "wait": "seconds to long-poll",
        "limit": "most items (1-1000)",
        "format": "json | ndjson (stream)",
    },
)
def results(job_id: str):
    settings = gateway_settings()
    after = int(query_number("after", 0, minimum=0, maximum=2**62))
    wait = query_number("wait", 0, minimum=0, maximum=settings.results_max_wait, integer=False)
    limit = int(query_number("limit", 100, minimum=1, maximum=1000))
    stream = request.args.get("format") == "ndjson" or "application/x-ndjson" in request.headers.get("Accept", "")
    with session_scope(settings.db_url) as s:
        get_job(s, job_id, g.owner)
    if stream:
        return Response(stream_with_context(_ndjson(job_id, after, wait)), mimetype="application/x-ndjson")
    return _page(job_id, after, limit, wait)


def _page(job_id: str, after: int, limit: int, wait: float) -> ResultsPage:
    deadline = time.monotonic() + wait
    while True:
        with session_scope(gateway_settings().db_url) as s:
            items = results_after(s, job_id, after, limit)
            view = job_view(s, get_job(s, job_id))
        done = view.finished >= view.n_rollouts
        if items or done or time.monotonic() >= deadline:
            cursor = items[-1].seq if items else after
            return ResultsPage(
                job_id=job_id, items=items, cursor=cursor, done=done and (not items or cursor >= view.finished)
            )
        time.sleep(POLL_SECONDS)


def _ndjson(job_id: str, after: int, wait: float):
    """One JSON line per finished rollout until the job is done or `wait` passes idle."""
    idle_deadline = time.monotonic() + wait
    while True:
        page = _page(job_id, after, 100, 0)
        for item in page.items:
            yield json.dumps(item.model_dump(mode="json")) + "\n"
        if page.items:
            after = page.cursor
            idle_deadline = time.monotonic() + wait
        if page.done:
            return
        if time.monotonic() >= idle_deadline:
            return
        time.sleep(POLL_SECONDS)
