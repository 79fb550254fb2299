"""ProRL-Agent-compatible routes, so trainers integrated with ProRL work unchanged.

`/process` runs one rollout through the same pipeline as `/v1/jobs` and blocks until it ends;
the answer has ProRL's shape (`prorl_results`). The lifecycle is ProRL's: until `/start`,
`/process`, `/status` and `/stop` answer 503; `/stop` cancels the ProRL work still in flight.
The started state is a row in `service_flags`, so every gateway process (gunicorn workers,
several gateways) agrees on it.
ProRL's `job_id` groups `/process` calls so `/cancel` can stop them together; a cancelled
rollout's in-flight generation is aborted (its HTTP request closed) rather than awaited.
Errors on these routes have ProRL's (FastAPI's) body: `{"detail": ...}`, 422 for a body that
does not validate.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from flask import Blueprint, current_app, g, jsonify
from pydantic import ValidationError
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from app.api.prorl_datasets import map_instance
from app.api.prorl_results import prorl_result
from app.api.prorl_wire import AddServer, CancelRequest, ProcessRequest, ProRLSampling
from app.api.routing import typed_route
from app.auth import require_admin
from app.jobs import cancel_job, create_job
from app.schemas import Instance, JobCreate, LLMServerCreate
from app.servers import clear_servers, register_server
from core.db import session_scope
from core.errors import (
    Conflict,
    InvalidRequest,
    RaasError,
    ServiceUnavailable,
    StageTimeout,
    validation_error,
)
from core.models import TERMINAL_VALUES, Job, LLMServer, Rollout, ServiceFlag, Turn, utcnow

bp = Blueprint("prorl", __name__)
POLL_SECONDS = 0.2
NOT_RUNNING = "Server is not running. Please start the server first."
RUNNING_FLAG = "prorl_running"


class ServerNotRunning(ServiceUnavailable):
    """A ProRL route that needs /start was called before it (ProRL's 503)."""

    code = "server_not_running"


@bp.errorhandler(RaasError)
def _detail_body(exc: RaasError):
    """ProRL's error body: `{"detail": message}`; body validation errors are 422 with a list."""
    errors = exc.details.get("errors") if isinstance(exc, InvalidRequest) else None
    if errors:
        detail = [{"loc": ["body", *e["field"].split(".")], "msg": e["message"]} for e in errors]
        resp = jsonify({"detail": detail})
        resp.status_code = 422
        return resp
    resp = jsonify({"detail": exc.message})
    resp.status_code = exc.http_status
    return resp


@bp.errorhandler(RequestEntityTooLarge)  # the app has its own for this one: be more specific
@bp.errorhandler(HTTPException)
def _http_detail(exc: HTTPException):
    """Werkzeug's HTTP errors (413, 405, ...) in ProRL's body."""
    resp = jsonify({"detail": exc.description or exc.name})
    resp.status_code = exc.code or 500
    return resp


@bp.errorhandler(OperationalError)
def _database_detail(exc: OperationalError):
    resp = jsonify({"detail": "the database is unavailable; retry shortly"})
    resp.status_code = 503
    return resp


@bp.errorhandler(Exception)
def _unexpected_detail(exc: Exception):
    current_app.logger.exception("ProRL route failed")
    resp = jsonify({"detail": f"{type(exc).__name__}: {exc}"})
    resp.status_code = 500
    return resp


def _settings():
    return current_app.config["RAAS"]


def _is_running() -> bool:
    """ProRL's started/stopped state, in the database so every gateway process agrees."""
    with session_scope(_settings().db_url) as s:
        flag = s.get(ServiceFlag, RUNNING_FLAG)
        return bool(flag and flag.enabled)


def _set_running(value: bool) -> bool:
    """Switch the state; False when it already was `value` (one UPDATE decides races)."""
    with session_scope(_settings().db_url) as s:
        changed = s.execute(update(ServiceFlag).where(
            ServiceFlag.name == RUNNING_FLAG, ServiceFlag.enabled.is_not(value))
            .values(enabled=value, updated_at=utcnow())).rowcount
        if changed or s.get(ServiceFlag, RUNNING_FLAG) is not None:
            return bool(changed)
    try:
        with session_scope(_settings().db_url) as s:
            s.add(ServiceFlag(name=RUNNING_FLAG, enabled=value))
        return True
    except IntegrityError:  # another gateway created it first
        return _set_running(value)


def _require_running() -> None:
    if not _is_running():
        raise ServerNotRunning(NOT_RUNNING)


@typed_route(bp, "/process", "POST", body=ProcessRequest, tag="prorl",
             summary="Run one rollout (blocking), ProRL's shape")
def process(body: ProcessRequest) -> dict[str, Any]:
    _require_running()
    started = time.monotonic()
    settings = _settings()
    try:
        parts = ProRLSampling.model_validate(body.sampling_params).job_parts()
    except ValidationError as exc:  # a bad value: 422 naming body.sampling_params.<key>
        raise _prefixed(validation_error(exc), "sampling_params") from exc
    mapped = map_instance(body.instance)
    try:
        req = JobCreate(agent=mapped.agent,
                        instances=[Instance(instance_id=mapped.instance_id, data=mapped.data)],
                        sampling=parts["sampling"], limits=parts["limits"], llm=parts["llm"],
                        agent_config=body.agent_config or {})
    except ValidationError as exc:  # e.g. an instance_id longer than 256 characters
        raise validation_error(exc, "instance") from exc
    prorl_job_id = body.job_id or uuid.uuid4().hex
    accepted = create_job(settings, req, g.owner, current_app.extensions["celery"],
                          admin=g.admin,
                          labels={"prorl_job_id": prorl_job_id,
                                  "prorl_data_source": mapped.data_source})
    rollout = _wait_terminal(settings.db_url, accepted.rollout_ids[0], settings.process_max_wait)
    with session_scope(settings.db_url) as s:
        turns = s.scalars(select(Turn).where(Turn.rollout_id == rollout.id,
                                             Turn.attempt == rollout.attempt)
                          .order_by(Turn.index)).all()
        s.expunge_all()
    return prorl_result(rollout, list(turns), body.instance, mapped.instance_id,
                        wall_seconds=time.monotonic() - started)


def _prefixed(error: InvalidRequest, prefix: str) -> InvalidRequest:
    """The same validation error with its fields under `prefix`."""
    for item in error.details.get("errors", []):
        item["field"] = f"{prefix}.{item['field']}"
    return error


def _wait_terminal(db_url: str, rollout_id: str, max_wait: float) -> Rollout:
    deadline = time.monotonic() + max_wait
    while True:
        with session_scope(db_url) as s:
            r = s.get(Rollout, rollout_id)
            if r.status in TERMINAL_VALUES:
                s.expunge(r)
                return r
        if time.monotonic() > deadline:
            raise StageTimeout("Processing timed out")
        time.sleep(POLL_SECONDS)


def _prorl_jobs(s, job_id: str | None = None, unfinished: bool = False,
                owner: str | None = None) -> list[str]:
    """Ids of jobs created by /process (with ProRL job id `job_id`, of `owner` if given)."""
    tag = Job.config[("labels", "prorl_job_id")].as_string()
    q = select(Job.id).where(tag == job_id if job_id is not None else tag.is_not(None))
    if owner is not None:
        q = q.where(Job.owner == owner)
    if unfinished:
        q = q.where(Job.id.in_(select(Rollout.job_id).where(
            Rollout.status.not_in(TERMINAL_VALUES))))
    return list(s.scalars(q).all())


@typed_route(bp, "/cancel", "POST", body=CancelRequest, summary="Cancel a ProRL job_id",
             tag="prorl")
def cancel(body: CancelRequest) -> dict[str, Any]:
    settings = _settings()
    with session_scope(settings.db_url) as s:
        ids = _prorl_jobs(s, body.job_id, unfinished=True, owner=g.owner)
    for job_id in ids:
        cancel_job(settings, job_id, g.owner)
    return {"status": f"Cancel requested for job {body.job_id}", "cancelled_jobs": len(ids)}


@typed_route(bp, "/status", "GET", summary="Service status, ProRL style", tag="prorl")
def status() -> dict[str, Any]:
    _require_running()
    with session_scope(_settings().db_url) as s:
        servers = [{"address": u, "healthy": h, "in_flight": n} for u, h, n in
                   s.execute(select(LLMServer.url, LLMServer.healthy, LLMServer.in_flight)
                             .where(LLMServer.owner == g.owner))]
        pending = s.scalar(select(func.count()).select_from(Rollout).where(
            Rollout.status.not_in(TERMINAL_VALUES),
            Rollout.job_id.in_(select(Job.id).where(
                Job.owner == g.owner,
                Job.config[("labels", "prorl_job_id")].as_string().is_not(None)))))
    return {"status": "running", "running": True, "pending_jobs": pending,
            "busy": bool(pending), "llm_servers": servers}


@typed_route(bp, "/add_llm_server", "POST", body=AddServer, summary="Register a server",
             tag="prorl")
def add_llm_server(body: AddServer) -> dict[str, Any]:
    url = body.address if "://" in body.address else f"http://{body.address}"
    try:
        server = LLMServerCreate(url=url)
    except ValidationError as exc:  # not a URL (spaces, control characters, bad port): 422
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise InvalidRequest(f"address: {message}", field="address",
                             errors=[{"field": "address", "message": message}]) from exc
    try:
        register_server(_settings().db_url, server, g.owner, g.admin, _settings().policy.llm)
    except Conflict:  # ProRL keeps the address it already has and answers 200
        return {"status": f"LLM server address {server.url} already registered",
                "added": server.url}
    return {"status": f"Added LLM server address: {server.url}", "added": server.url}


@typed_route(bp, "/clear_llm_server", "POST", summary="Remove every server", tag="prorl")
def clear_llm_server() -> dict[str, Any]:
    removed = clear_servers(_settings().db_url, g.owner)
    return {"status": "Cleared all LLM server addresses", "removed": removed}


@typed_route(bp, "/start", "POST", summary="Start accepting /process (400 if running)",
             tag="prorl")
@require_admin
def start() -> dict[str, Any]:
    if not _set_running(True):
        raise InvalidRequest("Server is already running")
    return {"status": "Server started successfully"}


@typed_route(bp, "/stop", "POST", summary="Stop accepting /process; cancel ProRL work in flight",
             tag="prorl")
@require_admin
def stop() -> dict[str, Any]:
    if not _is_running() or not _set_running(False):
        raise ServerNotRunning(NOT_RUNNING)
    settings = _settings()
    with session_scope(settings.db_url) as s:
        ids = _prorl_jobs(s, unfinished=True)
    for job_id in ids:
        cancel_job(settings, job_id)
    return {"status": "Server stopped successfully", "cancelled_jobs": len(ids)}
