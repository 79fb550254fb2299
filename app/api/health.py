"""Liveness, readiness (database and broker reachable, a consumer on every stage queue),
Prometheus metrics and the OpenAPI doc."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify
from sqlalchemy import text

from app.context import gateway_settings
from app.metrics import render, worker_queues
from app.openapi import build_openapi
from core.db import session_scope

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    """The process is up."""
    return {"ok": True}


@bp.get("/readyz")
def readyz():
    """Database and broker answer and every stage queue has a consumer; 503 naming what is not."""
    settings = gateway_settings()
    celery = current_app.extensions["celery"]
    checks: dict[str, Any] = {}
    try:
        with session_scope(settings.db_url) as s:
            s.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure is the readiness answer
        checks["database"] = f"error: {exc.__class__.__name__}: {exc}"[:300]
    try:
        with celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
        stages = stage_consumers(worker_queues(celery))
        idle = [queue for queue, n in stages.items() if n == 0]
        checks["stages"] = stages
        checks["workers"] = "ok" if not idle else f"error: no worker consumes {', '.join(idle)}"
    except Exception as exc:  # noqa: BLE001 - any failure is the readiness answer
        checks.setdefault("broker", f"error: {exc.__class__.__name__}: {exc}"[:300])
    ready = all(v == "ok" for k, v in checks.items() if k != "stages")
    resp = jsonify({"ready": ready, **checks})
    resp.status_code = 200 if ready else 503
    return resp


def stage_consumers(workers: dict[str, list[str]]) -> dict[str, int]:
    """Consumers of `init` and of run/eval of every node with a live pool.

    A node is known by its pools' names (`<stage>@<node>-<pid>`, tasks/worker.py), so a node
    whose RUN pool died while its INIT or EVAL pool lives shows `run.<node>: 0`.
    """
    counts: dict[str, int] = {"init": 0}
    for name, queues in workers.items():
        node = name.partition("@")[2].rpartition("-")[0]
        for queue in (f"run.{node}", f"eval.{node}") if node else ():
            counts.setdefault(queue, 0)
        for queue in queues:
            counts[queue] = counts.get(queue, 0) + 1
    return {q: n for q, n in counts.items() if q == "init" or q.startswith(("run.", "eval."))}


@bp.get("/metrics")
def metrics():
    """Prometheus text format."""
    from app.job_health import app_cache

    body = render(gateway_settings().db_url, current_app.extensions["celery"], app_cache())
    return Response(body, mimetype="text/plain; version=0.0.4")


@bp.get("/openapi.json")
def openapi():
    """The OpenAPI document generated from the wire models."""
    return build_openapi()
