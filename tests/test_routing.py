"""Routing: one router for every process; a stage message without a node is impossible to miss."""

from __future__ import annotations

from app.metrics import render
from core.settings import Settings
from migrations.runner import upgrade
from tasks.celery_app import make_celery
from tasks.broker.config import UNROUTED_QUEUE, route_stage
from tasks.broker.queues import queue_depths
from tasks.broker.publish import publish


def test_router_sends_later_stages_to_the_init_node():
    assert route_stage("raas.init", ["r", 1], {}, {}) == {"queue": "init"}
    assert route_stage("raas.run", ["r", 1], {"node": "gpu7"}, {}) == {"queue": "run.gpu7"}
    assert route_stage("raas.eval", ["r", 1], {"node": "gpu7"}, {}) == {"queue": "eval.gpu7"}
    assert route_stage("raas.run", ["r", 1], {}, {}) == {"queue": UNROUTED_QUEUE}
    assert route_stage("raas.reevaluate", ["r", "x"], {}, {}) == {"queue": "init"}
    assert route_stage("something.else", [], {}, {}) is None


def test_misrouted_message_shows_in_metrics(tmp_path):
    settings = Settings(home=tmp_path)
    upgrade(settings.db_url)
    celery = make_celery(settings)
    publish(celery, "run", "r1", 1, node=None)  # a bug: RUN without the INIT node
    publish(celery, "run", "r2", 1, node="n1")
    assert queue_depths(celery, [UNROUTED_QUEUE, "run.n1"]) == {UNROUTED_QUEUE: 1, "run.n1": 1}
    assert f'raas_queue_depth{{queue="{UNROUTED_QUEUE}"}} 1.0' in render(settings.db_url, celery).decode()
