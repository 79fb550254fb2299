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
from sqlalchemy.exc import OperationalError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from app.api.prorl_datasets import map_instance
from app.api.prorl_results import prorl_result
from app.api.prorl_wire import AddServer, CancelRequest, ProcessRequest, ProRLSampling
from app.api.routing import typed_route
from app.auth import require_admin
from app.context import gateway_settings
from app.jobs import cancel_job, create_job
from app.prorl_service import is_running, prorl_jobs, prorl_status, set_running, wait_terminal
from app.schemas import Instance, JobCreate, LLMServerCreate
from app.servers import clear_servers, register_server
from core.errors import (
    Conflict,
    InvalidRequest,
    RaasError,
    ServiceUnavailable,
    validation_error,
)

bp = Blueprint("prorl", __name__)
NOT_RUNNING = "Server is not running. Please start the server first."


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


def _require_running() -> None:
    if not is_running(gateway_settings().db_url):
        raise ServerNotRunning(NOT_RUNNING)


@typed_route(
    bp, "/process", "POST", body=ProcessRequest, tag="prorl", summary="Run one rollout (blocking), ProRL's shape"
)
def process(body: ProcessRequest) -> dict[str, Any]:
    _require_running()
    started = time.monotonic()
    settings = gateway_settings()
    try:
        parts = ProRLSampling.model_validate(body.sampling_params).job_parts()
    except ValidationError as exc:  # a bad value: 422 naming body.sampling_params.<key>
        raise _prefixed(validation_error(exc), "sampling_params") from exc
    mapped = map_instance(body.instance)
    try:
        req = JobCreate(
            agent=mapped.agent,
            instances=[Instance(instance_id=mapped.instance_id, data=mapped.data)],
            sampling=parts["sampling"],
            limits=parts["limits"],
            llm=parts["llm"],
            agent_config=body.agent_config or {},
        )
    except ValidationError as exc:  # e.g. an instance_id longer than 256 characters
        raise validation_error(exc, "instance") from exc
    prorl_job_id = body.job_id or uuid.uuid4().hex
    accepted = create_job(
        settings,
        req,
        g.owner,
        current_app.extensions["celery"],
        admin=g.admin,
        labels={"prorl_job_id": prorl_job_id, "prorl_data_source": mapped.data_source},
    )
    rollout, turns = wait_terminal(settings.db_url, accepted.rollout_ids[0], settings.process_max_wait)
    return prorl_result(rollout, turns, body.instance, mapped.instance_id, wall_seconds=time.monotonic() - started)


def _prefixed(error: InvalidRequest, prefix: str) -> InvalidRequest:
    """The same validation error with its fields under `prefix`."""
    for item in error.details.get("errors", []):
        item["field"] = f"{prefix}.{item['field']}"
    return error


@typed_route(bp, "/cancel", "POST", body=CancelRequest, summary="Cancel a ProRL job_id", tag="prorl")
def cancel(body: CancelRequest) -> dict[str, Any]:
    settings = gateway_settings()
    ids = prorl_jobs(settings.db_url, body.job_id, unfinished=True, owner=g.owner)
    for job_id in ids:
        cancel_job(settings, job_id, g.owner, current_app.extensions["celery"])
    return {"status": f"Cancel requested for job {body.job_id}", "cancelled_jobs": len(ids)}


@typed_route(bp, "/status", "GET", summary="Service status, ProRL style", tag="prorl")
def status() -> dict[str, Any]:
    _require_running()
    found = prorl_status(gateway_settings().db_url, g.owner)
    return {
        "status": "running",
        "running": True,
        "pending_jobs": found["pending_jobs"],
        "busy": bool(found["pending_jobs"]),
        "llm_servers": found["llm_servers"],
    }


@typed_route(bp, "/add_llm_server", "POST", body=AddServer, summary="Register a server", tag="prorl")
def add_llm_server(body: AddServer) -> dict[str, Any]:
    url = body.address if "://" in body.address else f"http://{body.address}"
    try:
        server = LLMServerCreate(url=url)
    except ValidationError as exc:  # not a URL (spaces, control characters, bad port): 422
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise InvalidRequest(
            f"address: {message}", field="address", errors=[{"field": "address", "message": message}]
        ) from exc
    try:
        register_server(gateway_settings().db_url, server, g.owner, g.admin, gateway_settings().policy.llm)
    except Conflict:  # ProRL keeps the address it already has and answers 200
        return {"status": f"LLM server address {server.url} already registered", "added": server.url}
    return {"status": f"Added LLM server address: {server.url}", "added": server.url}


@typed_route(bp, "/clear_llm_server", "POST", summary="Remove every server", tag="prorl")
def clear_llm_server() -> dict[str, Any]:
    removed = clear_servers(gateway_settings().db_url, g.owner)
    return {"status": "Cleared all LLM server addresses", "removed": removed}


@typed_route(bp, "/start", "POST", summary="Start accepting /process (400 if running)", tag="prorl")
@require_admin
def start() -> dict[str, Any]:
    if not set_running(gateway_settings().db_url, True):
        raise InvalidRequest("Server is already running")
    return {"status": "Server started successfully"}


@typed_route(bp, "/stop", "POST", summary="Stop accepting /process; cancel ProRL work in flight", tag="prorl")
@require_admin
def stop() -> dict[str, Any]:
    settings = gateway_settings()
    if not is_running(settings.db_url) or not set_running(settings.db_url, False):
        raise ServerNotRunning(NOT_RUNNING)
    ids = prorl_jobs(settings.db_url, unfinished=True)
    for job_id in ids:
        cancel_job(settings, job_id, celery=current_app.extensions["celery"])
    return {"status": "Server stopped successfully", "cancelled_jobs": len(ids)}
