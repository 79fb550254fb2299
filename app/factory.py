"""Flask app factory: settings, Celery, blueprints, auth and error handling in one place."""
from __future__ import annotations

import hmac
import logging
from typing import Any

from flask import Flask, g, request

from agents.registry import load_handler_modules
from app import ui
from app.api import errors, health, jobs, llm_servers, prorl, rollouts
from core.errors import Unauthorized
from core.settings import load_settings
from tasks.celery_app import make_celery

log = logging.getLogger(__name__)
OPEN_PATHS = {"/healthz", "/readyz", "/metrics", "/openapi.json"}


def build_app(config: Any = None) -> Flask:
    """A gateway for `config` (Settings, a dict of overrides, or None for the environment)."""
    settings = load_settings(config)
    load_handler_modules(settings.handler_modules)
    app = Flask("raas")
    app.config["RAAS"] = settings
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False
    app.extensions["celery"] = make_celery(settings)
    for module in (jobs, rollouts, llm_servers, health, prorl, ui):
        app.register_blueprint(module.bp)
    errors.register_error_handlers(app)
    app.before_request(_authenticate)
    return app


def _authenticate() -> None:
    """Bearer-token auth when `RAAS_API_TOKEN` is set; every caller is one owner."""
    from flask import current_app

    token = current_app.config["RAAS"].api_token
    g.owner = "default"
    if token is None or request.path in OPEN_PATHS:
        return
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise Unauthorized("missing or wrong bearer token")
