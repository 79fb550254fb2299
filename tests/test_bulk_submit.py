"""Bounded cost per request and per owner, through the real gateway and real workers: caps
answer 400/429 naming the cap; a large job is answered before it is published and every
rollout reaches the broker exactly once (also when the gateway dies between its commit and
the publish: the reaper drains the outbox); cancel of a job with queued and running
rollouts keeps counts, the results cursor and group_complete right."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from core.db import session_scope
from tasks.broker.queues import queue_depths
from core.models import Rollout, Turn
from raas_client.sdk import RaasHTTPError
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import start_service, wait_for

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`


@pytest.fixture(params=["embedded", "redis+postgresql"])
def backend(request, tmp_path) -> dict:
    """Service keyword arguments for each backend."""
    if request.param == "embedded":
        return {}
    return {
        "db_url": request.getfixturevalue("pg_url"),
        "broker_url": REDIS_URL,
        "key_prefix": request.getfixturevalue("redis_prefix"),
    }


def _outbox(svc, job_id: str) -> int:
    with session_scope(svc.settings.db_url) as s:
        return s.scalar(
            sa.select(sa.func.count())
            .select_from(Rollout)
            .where(Rollout.job_id == job_id, Rollout.outbox_at.is_not(None))
        )


def _init_depth(svc) -> int:
    return queue_depths(svc._server.app.extensions["celery"], ["init"])["init"]


def _turns(svc) -> int:
    with session_scope(svc.settings.db_url) as s:
        return s.scalar(sa.select(sa.func.count()).select_from(Turn))


def test_caps_answer_400_and_429_naming_the_cap(tmp_path, backend):
    svc = start_service(
        tmp_path, stages=(), reaper=True, **backend, extra={"max_rollouts_per_job": 50, "max_in_flight_per_owner": 80}
    )
    try:
        with pytest.raises(RaasHTTPError) as too_big:
            svc.client.submit("test-trivial", [{"instance_id": f"i{k}"} for k in range(13)], n_samples=4)
        body = too_big.value.body
        assert too_big.value.status == 400 and "max_rollouts_per_job" in body["message"]
        assert body["details"] == {"field": "instances", "cap": "max_rollouts_per_job", "limit": 50, "requested": 52}
        first = svc.client.submit("test-trivial", [{"instance_id": f"i{k}"} for k in range(50)])
        with pytest.raises(RaasHTTPError) as busy:
            svc.client.submit("test-trivial", [{"instance_id": f"j{k}"} for k in range(31)])
        assert busy.value.status == 429 and "max_in_flight_per_owner" in busy.value.body["message"]
        assert busy.value.body["details"] == {
            "cap": "max_in_flight_per_owner",
            "limit": 80,
            "in_flight": 50,
            "requested": 31,
        }
        assert svc.client.submit("test-trivial", [{"instance_id": "j"}] * 1).created
        # what finishes (here: is cancelled) no longer counts against the owner
        svc.client.cancel(first.job_id)
        again = svc.client.submit("test-trivial", [{"instance_id": f"j{k}"} for k in range(31)])
        assert len(again.rollout_ids) == 31
    finally:
        svc.stop()


def test_large_job_is_answered_first_and_published_exactly_once(tmp_path, backend):
    svc = start_service(tmp_path, stages=(), **backend)  # no workers yet: count the messages
    try:
        t0 = time.monotonic()
        # 600 rollouts: above the inline limit, so the publisher process takes them
        job = svc.client.submit("test-trivial", [{"instance_id": f"i{k:04d}"} for k in range(150)], n_samples=4)
        answered = time.monotonic() - t0
        assert len(job.rollout_ids) == 600 and answered < 30
        wait_for(lambda: _outbox(svc, job.job_id) == 0, 60, "the outbox to drain")
        assert _init_depth(svc) == 600
        for stage in ("init", "run", "eval"):
            svc.start_worker(stage, "node-a", 4)
        done = svc.wait_done(job.job_id, timeout=240)
        assert done.counts == {"done": 600} and done.outcomes == {"completed": 600}
        results = svc.all_results(job.job_id)
        assert [r.seq for r in results] == list(range(1, 601))
        assert all(r.reward == 1.0 and r.attempt == 1 for r in results)
        assert _init_depth(svc) == 0
    finally:
        svc.stop()


def test_large_jobs_are_published_by_a_process_that_is_replaced_when_it_dies(tmp_path, backend):
    """A large job is published outside the gateway process; a publisher process killed
    between two jobs is replaced, and every message still goes out exactly once."""
    import os

    from tasks.broker.outbox import INLINE_MAX, OutboxPublisher

    svc = start_service(tmp_path, stages=(), reaper=False, **backend)
    try:
        celery = svc._server.app.extensions["celery"]
        n = (INLINE_MAX // 2 + 1) * 2  # above the inline limit
        first = svc.client.submit("test-trivial", [{"instance_id": f"a{k:04d}"} for k in range(n // 2)], n_samples=2)
        wait_for(lambda: _outbox(svc, first.job_id) == 0, 60, "the outbox to drain")
        pub = celery.raas_parts.get(OutboxPublisher)  # the gateway's
        child = pub._process
        assert child is not None and child.pid != os.getpid() and child.poll() is None and _init_depth(svc) == n
        child.kill()
        child.wait(10)
        second = svc.client.submit("test-trivial", [{"instance_id": f"b{k:04d}"} for k in range(n // 2)], n_samples=2)
        wait_for(lambda: _outbox(svc, second.job_id) == 0, 60, "the outbox to drain")
        assert pub._process is not None and pub._process.pid != child.pid
        assert _init_depth(svc) == 2 * n
        small = svc.client.submit("test-trivial", [{"instance_id": "c"}])  # inline thread
        wait_for(lambda: _outbox(svc, small.job_id) == 0, 30, "the small job's publish")
        assert _init_depth(svc) == 2 * n + 1
    finally:
        svc.stop()


def test_reaper_publishes_what_a_dead_gateway_left_in_the_outbox(tmp_path, backend, monkeypatch):
    """The gateway dying right after its commit is simulated by an outbox thread that never
    runs (rows committed with their marks, nothing published); everything else is real."""
    from tasks.broker.outbox import OutboxPublisher

    monkeypatch.setattr(OutboxPublisher, "submit", lambda self, ids: None)
    svc = start_service(tmp_path, stages=(), reaper=False, **backend, extra={"outbox_grace": 1.0})
    try:
        job = svc.client.submit("test-trivial", [{"instance_id": f"i{k:04d}"} for k in range(30)], n_samples=4)
        time.sleep(1.5)
        assert _outbox(svc, job.job_id) == 120 and _init_depth(svc) == 0
        from tasks.recovery.reaper import Reaper

        reaper = Reaper(svc.settings, svc._server.app.extensions["celery"])
        counts = reaper.run_once()
        assert counts["outbox"] == 120 and counts["requeued"] == 0
        assert _outbox(svc, job.job_id) == 0 and _init_depth(svc) == 120
        assert reaper.run_once()["outbox"] == 0 and _init_depth(svc) == 120  # nothing twice
        for stage in ("init", "run", "eval"):
            svc.start_worker(stage, "node-a", 4)
        done = svc.wait_done(job.job_id, timeout=240)
        assert done.outcomes == {"completed": 120}
    finally:
        svc.stop()


def test_cancel_with_queued_and_running_rollouts(tmp_path, backend):
    svc = start_service(tmp_path, **backend, concurrency={"init": 2, "run": 2, "eval": 2})
    try:
        job = svc.client.submit(
            "test-sleepy",
            [{"instance_id": f"i{k}"} for k in range(10)],
            n_samples=4,
            agent_config={"init_s": 1, "run_s": 30, "turns": 30},
        )
        jid = job.job_id
        wait_for(lambda: _turns(svc) >= 2, 60, "rollouts turning in RUN")
        t0 = time.monotonic()
        view = svc.client.cancel(jid)
        assert time.monotonic() - t0 < 10
        assert view.status == "cancelling"
        assert view.counts.get("cancelled", 0) >= 30  # the queued ones ended at once
        done = svc.wait_done(jid, timeout=60)  # running ones stop at their next turn
        assert done.status == "cancelled" and done.counts == {"cancelled": 40}
        results = svc.all_results(jid)
        assert [r.seq for r in results] == list(range(1, 41))
        last_of: dict[str, int] = {}
        for r in results:
            last_of[r.instance_id] = r.seq
        assert {r.seq for r in results if r.group_complete} == set(last_of.values())
        stopped = [r for r in results if r.node]  # the ones that had started
        assert stopped and all(r.outcome == "cancelled" for r in stopped)
        assert _turns(svc) < 2 * 10  # the two running ones stopped early (30 turns each)
        # the stale INIT messages of the cancelled job do not hold up the next job
        nxt = svc.client.submit("test-trivial", [{"instance_id": "next"}])
        assert svc.wait_done(nxt.job_id, timeout=60).outcomes == {"completed": 1}
    finally:
        svc.stop()
