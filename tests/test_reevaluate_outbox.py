"""A re-evaluation request goes through the publication outbox, through the real gateway, real
workers and a real reaper: the request commits with the rollout's outbox mark before it is
published, so a request the gateway could not publish (its broker away, or the gateway dead
right after the commit: simulated by a publish that raises, everything else real) is accepted
all the same and the reaper's drain publishes it; its result is recorded exactly once and the
mark and the pending request are gone afterwards."""

from __future__ import annotations

import time

import pytest

from core.db import session_scope
from core.models import Rollout
from tasks.broker.config import PENDING_REEVALUATIONS, PIPELINE_EXTRA_KEYS
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import start_service, wait_for

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`


@pytest.fixture(params=["embedded", "redis+postgresql"])
def backend(request) -> dict:
    """Service keyword arguments for each backend."""
    if request.param == "embedded":
        return {}
    return {
        "db_url": request.getfixturevalue("pg_url"),
        "broker_url": REDIS_URL,
        "key_prefix": request.getfixturevalue("redis_prefix"),
    }


def _row(svc, rollout_id: str) -> tuple[object, dict]:
    with session_scope(svc.settings.db_url) as s:
        r = s.get(Rollout, rollout_id)
        return r.outbox_at, dict(r.extra or {})


def test_a_reevaluation_the_gateway_could_not_publish_is_drained(tmp_path, backend, monkeypatch):
    import tasks.broker.outbox
    from tasks.recovery.reaper import Reaper

    svc = start_service(tmp_path, reaper=False, **backend, extra={"outbox_grace": 1.0})
    try:
        job = svc.client.submit("test-trivial", [{"instance_id": "only"}])
        svc.wait_done(job.job_id)
        [rollout] = svc.all_results(job.job_id)
        rid = rollout.rollout_id

        # the plain path: published at once, graded, recorded; no mark, nothing pending
        first = svc.client.reevaluate(rid, wait=60)
        [entry] = first.extra["reevaluations"]
        assert entry["request_id"] == first.extra["reevaluation_request"]
        assert entry["reward"] == 1.0 and "error" not in entry
        mark, extra = _row(svc, rid)
        assert mark is None and PENDING_REEVALUATIONS not in extra

        # the publish fails: the request is accepted anyway, committed with its mark
        def broker_away(*args, **kwargs):
            raise ConnectionError("broker away (simulated)")

        monkeypatch.setattr(tasks.broker.outbox, "publish_reevaluation_message", broker_away)
        second = svc.client.reevaluate(rid, wait=0)
        request_id = second.extra["reevaluation_request"]
        mark, extra = _row(svc, rid)
        assert mark is not None and extra[PENDING_REEVALUATIONS] == [request_id]
        # pipeline state stays on the server: not in what a trainer reads, pending or not
        assert PIPELINE_EXTRA_KEYS.isdisjoint(second.extra)
        assert PIPELINE_EXTRA_KEYS.isdisjoint(svc.client.rollout(rid).extra)
        assert all(PIPELINE_EXTRA_KEYS.isdisjoint(r.extra) for r in svc.all_results(job.job_id))
        time.sleep(1.5)  # nothing reached a worker: still one result, and past the grace
        assert len(_row(svc, rid)[1]["reevaluations"]) == 1
        monkeypatch.undo()

        reaper = Reaper(svc.settings, svc._server.app.extensions["celery"])
        assert reaper.run_once()["outbox"] == 1
        entries = wait_for(
            lambda: (lambda e: e if len(e) == 2 else None)(_row(svc, rid)[1]["reevaluations"]),
            60,
            "the drained re-evaluation's result",
        )
        assert entries[1]["request_id"] == request_id and entries[1]["reward"] == 1.0
        mark, extra = _row(svc, rid)
        assert mark is None and PENDING_REEVALUATIONS not in extra
        assert reaper.run_once()["outbox"] == 0  # nothing twice
        shown = svc.client.rollout(rid)  # the wire shows both results, no pending request
        assert [e["request_id"] for e in shown.extra["reevaluations"]] == [entry["request_id"], request_id]
        assert PENDING_REEVALUATIONS not in shown.extra
    finally:
        svc.stop()
