"""Liveness, readiness (database + broker reachable), Prometheus metrics and the OpenAPI doc."""
from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from sqlalchemy import text

from app.metrics import render
from app.openapi import build_openapi
from core.db import session_scope

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    """The process is up."""
    return {"ok": True}


@bp.get("/readyz")
def readyz():
    """Database and broker both answer; 503 naming the one that does not."""
    settings = current_app.config["RAAS"]
    checks: dict[str, str] = {}
    try:
        with session_scope(settings.db_url) as s:
            s.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {exc.__class__.__name__}: {exc}"[:300]
    try:
        with current_app.extensions["celery"].connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {exc.__class__.__name__}: {exc}"[:300]
    ready = all(v == "ok" for v in checks.values())
    resp = jsonify({"ready": ready, **checks})
    resp.status_code = 200 if ready else 503
    return resp


@bp.get("/metrics")
def metrics():
    """Prometheus text format."""
    body = render(current_app.config["RAAS"].db_url, current_app.extensions["celery"])
    return Response(body, mimetype="text/plain; version=0.0.4")


@bp.get("/openapi.json")
def openapi():
    """The OpenAPI document generated from the wire models."""
    return build_openapi()
