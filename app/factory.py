"""Flask app factory: settings, Celery, blueprints, auth and error handling in one place."""
from __future__ import annotations

import logging
from typing import Any

from flask import Flask

from agents.registry import load_handler_modules
from app import ui
from app.api import errors, health, jobs, llm_servers, policy, prorl, rollouts
from app.auth import authenticate
from core.settings import load_settings
from tasks.celery_app import make_celery
from tasks.sandboxes import check_node_settings

log = logging.getLogger(__name__)


def build_app(config: Any = None) -> Flask:
    """A gateway for `config` (Settings, a dict of overrides, or None for the environment)."""
    settings = load_settings(config)
    load_handler_modules(settings.handler_modules)
    check_node_settings(settings)
    app = Flask("raas")
    app.config["RAAS"] = settings
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False
    app.extensions["celery"] = make_celery(settings)
    for module in (jobs, rollouts, llm_servers, policy, health, prorl, ui):
        app.register_blueprint(module.bp)
    errors.register_error_handlers(app)
    app.before_request(authenticate)
    return app
