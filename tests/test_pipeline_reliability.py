"""Failure handling with real worker processes: killed workers, two nodes, cancel, retries,
deadlines, lost broker messages."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from core.db import session_scope
from core.models import Rollout, Turn
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import start_service, wait_for

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`


@pytest.fixture
def redis_pg(tmp_path, pg_url, redis_prefix):
    """Keyword arguments for a Redis + PostgreSQL service."""
    return {"db_url": pg_url, "broker_url": REDIS_URL, "key_prefix": redis_prefix}


def _rows(svc, job_id):
    with session_scope(svc.settings.db_url) as s:
        return s.scalars(sa.select(Rollout).where(Rollout.job_id == job_id)).all()


@pytest.mark.parametrize("backend", ["embedded", "redis+postgresql"])
def test_sigkill_run_worker_mid_rollout_finishes_exactly_once(backend, tmp_path, request):
    kwargs = request.getfixturevalue("redis_pg") if backend != "embedded" else {}
    svc = start_service(tmp_path, **kwargs)
    try:
        job = svc.client.submit("test-sleepy", [{"instance_id": "a"}], agent_config={"run_s": 6, "turns": 6})
        rid = job.rollout_ids[0]

        def running_with_turns():
            with session_scope(svc.settings.db_url) as s:
                r = s.get(Rollout, rid)
                n = s.scalar(sa.select(sa.func.count()).select_from(Turn).where(Turn.rollout_id == rid))
                return r.status == "run" and r.lease_owner and n >= 1

        wait_for(running_with_turns, what="rollout mid-RUN")
        svc.kill_worker("run", "node-a")  # SIGKILL: no ack, no cleanup
        svc.start_worker("run", "node-a")
        done = svc.wait_done(job.job_id, timeout=90)
        assert done.counts == {"done": 1}
        results = svc.all_results(job.job_id)
        assert len(results) == 1 and results[0].seq == 1
        assert results[0].attempt == 2 and results[0].outcome == "completed"
        with session_scope(svc.settings.db_url) as s:
            attempts = s.scalars(sa.select(Turn.attempt).where(Turn.rollout_id == rid)).all()
        assert 1 in attempts and attempts.count(2) == 6  # attempt 1's partial log is kept
        # The view groups turns by attempt: the trajectory's (current) turns, then history.
        view = svc.client.rollout(rid)
        assert [t.attempt for t in view.turns] == [2] * 6 and view.error is None
        [earlier] = view.earlier_attempts
        assert earlier.attempt == 1 and earlier.turns and "stopped beating" in earlier.error
        # a late redelivery of the killed message finds nothing to claim: still exactly once
        time.sleep(1)
        assert svc.client.job(job.job_id).finished == 1
    finally:
        svc.stop()


def test_two_nodes_run_and_eval_stay_on_the_init_node(tmp_path, redis_pg):
    svc = start_service(tmp_path, nodes=("node-a", "node-b"), **redis_pg)
    try:
        # Both INIT pools consuming before the job goes in: otherwise the first one up may take
        # the whole job before the other starts (a loaded machine starts workers seconds apart).
        wait_for(
            lambda: all(
                "INIT pool ready" in (svc.logs / f"init-{node}.log").read_text() for node in ("node-a", "node-b")
            ),
            timeout=120,
            what="both nodes' INIT pools ready",
        )
        job = svc.client.submit(
            "test-sleepy", [{"instance_id": f"i{k}"} for k in range(24)], agent_config={"init_s": 0.3, "run_s": 0.1}
        )
        svc.wait_done(job.job_id, timeout=60)
        results = svc.all_results(job.job_id)
        inits = set()
        for r in results:
            where = r.extra["where"]
            assert where["init"]["node"] == where["run"]["node"] == where["eval"]["node"]
            assert r.node == where["init"]["node"]
            inits.add(where["init"]["node"])
        assert inits == {"node-a", "node-b"}  # the shared init queue fed both nodes
    finally:
        svc.stop()


def test_cancel_stops_queued_and_running_rollouts(tmp_path):
    svc = start_service(tmp_path, concurrency=2)
    try:
        job = svc.client.submit(
            "test-sleepy", [{"instance_id": f"i{k}"} for k in range(8)], agent_config={"run_s": 20, "turns": 40}
        )
        wait_for(
            lambda: any(r.status == "run" and r.lease_owner for r in _rows(svc, job.job_id)),
            what="a running rollout",
        )
        view = svc.client.cancel(job.job_id)
        assert view.status in ("cancelling", "cancelled")
        done = svc.wait_done(job.job_id, timeout=30)
        assert done.status == "cancelled"
        assert done.outcomes == {"cancelled": 8}
        for r in _rows(svc, job.job_id):
            assert r.run_seconds is None or r.run_seconds < 10  # stopped at the next turn
    finally:
        svc.stop()


def test_infra_failures_retry_then_give_up(tmp_path):
    svc = start_service(tmp_path, extra={"max_attempts": 3})
    try:
        ok = svc.client.submit("test-sleepy", [{"instance_id": "x"}], agent_config={"fail_init_attempts": 2})
        bad = svc.client.submit("test-sleepy", [{"instance_id": "y"}], agent_config={"fail_init_attempts": 5})
        svc.wait_done(ok.job_id)
        svc.wait_done(bad.job_id)
        [r_ok] = svc.all_results(ok.job_id)
        [r_bad] = svc.all_results(bad.job_id)
        assert (r_ok.status, r_ok.outcome, r_ok.attempt) == ("done", "completed", 3)
        assert (r_bad.status, r_bad.outcome, r_bad.attempt) == ("failed", "infra_error", 3)
        assert "injected INIT failure" in r_bad.error and r_bad.reward is None
        # Completed: no error text from the failed attempts; their errors stay in the history.
        assert r_ok.error is None
        history = svc.client.rollout(r_ok.rollout_id).earlier_attempts
        assert [h.attempt for h in history] == [1, 2]
        assert all("injected INIT failure" in h.error for h in history)
    finally:
        svc.stop()


def test_stage_deadline_counts_only_running_time(tmp_path):
    svc = start_service(tmp_path, concurrency=1)
    try:
        # 6 rollouts of ~1 s on one RUN slot: the last waits >= 5 s in the queue, more than
        # its 4 s limit, yet none times out (4x headroom on the work itself for a busy machine)
        job = svc.client.submit(
            "test-sleepy",
            [{"instance_id": f"q{k}"} for k in range(6)],
            agent_config={"run_s": 1.0, "turns": 4},
            limits={"run_timeout": 4.0},
        )
        late = svc.client.submit(
            "test-sleepy",
            [{"instance_id": "slow"}],
            agent_config={"run_s": 20.0, "turns": 40},
            limits={"run_timeout": 1.0},
        )
        assert svc.wait_done(job.job_id, 90).outcomes == {"completed": 6}
        svc.wait_done(late.job_id, 90)
        [r] = svc.all_results(late.job_id)
        assert r.outcome == "timeout" and r.timing.run < 10
    finally:
        svc.stop()


def test_lost_broker_messages_are_republished(tmp_path, redis_pg):
    import redis

    svc = start_service(tmp_path, **redis_pg)
    try:
        svc.kill_worker("init", "node-a")
        job = svc.client.submit("test-sleepy", [{"instance_id": f"i{k}"} for k in range(4)])
        # the broker "restarts" empty: every queued message is gone
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{redis_pg['key_prefix']}*"):
            client.delete(key)
        svc.start_worker("init", "node-a")
        done = svc.wait_done(job.job_id, timeout=60)
        assert done.outcomes == {"completed": 4}
        assert all(r.attempt == 1 for r in svc.all_results(job.job_id))
    finally:
        svc.stop()


def test_reaper_repairs_the_llm_pool(tmp_path):
    """A server that died with slots held is marked down and its leaked slots are freed."""
    from core.models import LLMServer
    from core.settings import Settings
    from migrations.runner import upgrade
    from tasks.recovery.reaper import Reaper

    settings = Settings(home=tmp_path)
    upgrade(settings.db_url)
    with session_scope(settings.db_url) as s:
        s.add(LLMServer(url="http://127.0.0.1:9", in_flight=5))
    assert Reaper(settings, celery=None).maintain_llm_pool(force=True) == 1
    with session_scope(settings.db_url) as s:
        server = s.scalars(sa.select(LLMServer)).one()
        assert (server.in_flight, server.healthy) == (0, False) and server.last_error


def test_database_connections_dropped_mid_job_lose_nothing(tmp_path, redis_pg):
    """Every PostgreSQL connection of the service is killed mid-job (what a database restart
    does to clients): the gateway, workers and reaper reconnect, every rollout still ends."""
    from tests.conftest import _pg_admin_engine

    svc = start_service(tmp_path, **redis_pg)
    try:
        job = svc.client.submit(
            "test-sleepy", [{"instance_id": f"i{k}"} for k in range(6)], agent_config={"run_s": 2, "turns": 4}
        )
        wait_for(
            lambda: any(r.status == "run" and r.lease_owner for r in _rows(svc, job.job_id)),
            what="a running rollout",
        )
        dbname = sa.engine.make_url(redis_pg["db_url"]).database
        admin = _pg_admin_engine()
        with admin.connect() as conn:
            killed = conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = :db AND pid <> pg_backend_pid()"
                ),
                {"db": dbname},
            ).scalar()
        admin.dispose()
        assert killed >= 3  # gateway + the stage pools held connections
        done = svc.wait_done(job.job_id, timeout=120)
        assert done.counts == {"done": 6}, done
        results = svc.all_results(job.job_id)
        assert sorted(r.seq for r in results) == list(range(1, 7))
    finally:
        svc.stop()


def test_hung_stage_past_deadline_is_timed_out_by_the_reaper(tmp_path):
    """A hook that never reaches a checkpoint still beats; the reaper ends it at deadline +
    grace, and the hung thread's late writes are fenced off."""
    svc = start_service(tmp_path, concurrency=2)
    try:
        job = svc.client.submit(
            "test-sleepy",
            [{"instance_id": "stuck"}],
            agent_config={"run_s": 10, "turns": 0},  # one blocking sleep
            limits={"run_timeout": 1},
        )
        done = svc.wait_done(job.job_id, timeout=30)
        [r] = svc.all_results(job.job_id)
        assert (r.status, r.outcome) == ("failed", "timeout")
        assert "hung past its deadline" in r.error
        time.sleep(9)  # the hung thread wakes up and tries to hand the rollout on
        [again] = svc.all_results(job.job_id)
        assert again == r and svc.client.job(job.job_id).finished == 1 == done.finished
    finally:
        svc.stop()
