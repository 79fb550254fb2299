"""The single place that turns exceptions into JSON HTTP answers."""

from __future__ import annotations

import logging

from flask import Flask, jsonify
from sqlalchemy.exc import OperationalError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from core.errors import PayloadTooLarge, RaasError, ServiceUnavailable

log = logging.getLogger(__name__)


def _json(error: RaasError):
    resp = jsonify(error.to_dict())
    resp.status_code = error.http_status
    return resp


def register_error_handlers(app: Flask) -> None:
    """Map RaasError subclasses, HTTP errors and surprises to JSON bodies."""

    @app.errorhandler(RaasError)
    def _raas(exc: RaasError):
        if exc.http_status >= 500:
            log.error("request failed: %s", exc)
        return _json(exc)

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(exc: RequestEntityTooLarge):
        limit = app.config.get("MAX_CONTENT_LENGTH")
        return _json(PayloadTooLarge(f"request body exceeds {limit} bytes", limit=limit))

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        resp = jsonify(
            {"error": (exc.name or "http_error").lower().replace(" ", "_"), "message": exc.description or exc.name}
        )
        resp.status_code = exc.code or 500
        return resp

    @app.errorhandler(OperationalError)
    def _database_down(exc: OperationalError):
        log.warning("database unavailable: %s", exc.orig)
        return _json(ServiceUnavailable("the database is unavailable; retry shortly"))

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        resp = jsonify({"error": "internal_error", "message": f"{exc.__class__.__name__}: {exc}"})
        resp.status_code = 500
        return resp
