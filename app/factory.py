"""Flask app factory: settings, Celery, blueprints, auth and error handling in one place."""

from __future__ import annotations

import gc
import logging
import sys
from typing import Any

from flask import Flask

from agents.registry import load_handler_modules
from app import ui
from app.api import errors, events, health, job_health, jobs, llm_servers, policy, prorl, rollouts, validations, weights
from app.auth import authenticate
from core.db import configure_pool
from core.settings import Settings, load_settings
from tasks.broker.outbox import OutboxPublisher
from tasks.celery_app import make_celery
from tasks.process.parts import ProcessParts, Step
from tasks.sandboxing.sandboxes import check_node_settings

log = logging.getLogger(__name__)
# A large submission is CPU in a request thread (validation, rows, the bulk insert) for up to
# a second; every other request thread waits for the GIL at each of its I/O points, by default
# up to 5 ms each, which added up to > 100 ms per /healthz. Handing the GIL over every 0.5 ms
# keeps the gateway's other requests answering in a few ms at little cost to the big one.
SWITCH_INTERVAL_S = 0.0005
_startup_frozen = False


def _freeze_startup_objects() -> None:
    """Keep the objects of the process's start (modules, classes, the first app) out of the
    collector's full scans, once per process.

    A large submission allocates enough objects to trigger full collections; with every
    imported module in the heap each took ~85 ms holding the GIL (no other request of the
    gateway answered meanwhile). Frozen, a full collection scans only what came later (~10 ms).
    Collected first, so no garbage is frozen; `gc.freeze` also suits a forking server.
    """
    global _startup_frozen
    if not _startup_frozen:
        _startup_frozen = True
        gc.collect()
        gc.freeze()


def gateway_steps(settings: Settings, celery: Any) -> list[Step]:
    """The gateway process's long-lived parts (`tasks.process.parts`): the outbox publisher
    that sends accepted rollouts to the broker off the request threads."""
    return [Step(OutboxPublisher, lambda parts: OutboxPublisher(settings.db_url, celery))]


def build_app(config: Any = None) -> Flask:
    """A gateway for `config` (Settings, a dict of overrides, or None for the environment)."""
    settings = load_settings(config)
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
    load_handler_modules(settings.handler_modules)
    check_node_settings(settings)
    configure_pool(settings)
    app = Flask("raas")
    app.config["RAAS"] = settings
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False
    app.extensions["celery"] = celery = make_celery(settings)
    celery.raas_parts = ProcessParts(gateway_steps(settings, celery)).start()
    for module in (jobs, events, rollouts, llm_servers, weights, policy, health, prorl, validations, job_health, ui):
        app.register_blueprint(module.bp)
    errors.register_error_handlers(app)
    app.before_request(authenticate)
    _freeze_startup_objects()
    return app
