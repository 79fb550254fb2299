"""After a large cancel the next job runs at once (issue 25), through the real gateway and
real worker pools on both backends: the cancel removes the job's queued INIT messages from the
broker, the cancelled rollouts all end `cancelled` exactly once, a job queued behind the
cancelled one loses none of its messages and completes, and a new job finishes within
seconds with its reward and tokens."""

from __future__ import annotations

import re
import time

import pytest

from tests import test_bulk_submit as bulk
from bench.support.pipeline_harness import start_service, wait_for

backend = bulk.backend  # the fixture: each test on the embedded default and on Redis + PostgreSQL
_init_depth, _unpublished = bulk._init_depth, bulk._outbox

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

N_INSTANCES, N_SAMPLES = 250, 8  # 2,000 queued rollouts: minutes for 2 threads at INIT's 1 s each


def test_after_a_large_cancel_the_next_job_runs_at_once(tmp_path, backend):
    svc = start_service(tmp_path, **backend, concurrency={"init": 2, "run": 2, "eval": 2})
    try:
        big = svc.client.submit(
            "test-sleepy",
            [{"instance_id": f"i{k:04d}"} for k in range(N_INSTANCES)],
            n_samples=N_SAMPLES,
            agent_config={"init_s": 1.0, "run_s": 20.0, "turns": 20},
        )
        n_big = N_INSTANCES * N_SAMPLES
        # a job queued behind it: its messages share the lists the purge scans
        behind = svc.client.submit("test-trivial", [{"instance_id": f"b{k}"} for k in range(20)])
        wait_for(lambda: _unpublished(svc, big.job_id) == 0, 120, "the large job published")
        wait_for(lambda: _unpublished(svc, behind.job_id) == 0, 60, "the job behind it published")
        assert _init_depth(svc) > n_big - 50  # nearly all of it still queued

        view = svc.client.cancel(big.job_id)
        assert view.counts.get("cancelled", 0) > n_big - 50
        # the cancelled job's messages left the broker with the cancel: what is left is at most
        # the job behind it
        assert _init_depth(svc) <= 20

        t0 = time.monotonic()
        nxt = svc.client.submit("test-trivial", [{"instance_id": "next"}])
        done = svc.wait_done(nxt.job_id, timeout=60)
        took = time.monotonic() - t0
        assert done.outcomes == {"completed": 1}
        [result] = svc.all_results(nxt.job_id)
        assert result.reward == 1.0 and result.response_ids == [1] and result.prompt_ids == [0]
        assert took < 20, f"the next job took {took:.1f}s after the cancel"

        # nothing of the job behind was removed: every one of its rollouts completed
        others = svc.wait_done(behind.job_id, timeout=60)
        assert others.outcomes == {"completed": 20}
        assert all(r.reward == 1.0 and r.response_ids == [1] for r in svc.all_results(behind.job_id))

        # the cancelled job: every rollout cancelled, each exactly once in the results
        final = svc.wait_done(big.job_id, timeout=90)
        assert final.status == "cancelled" and final.counts == {"cancelled": n_big}
        results = svc.all_results(big.job_id)
        assert [r.seq for r in results] == list(range(1, n_big + 1))
        assert len({r.rollout_id for r in results}) == n_big
        assert all(r.outcome == "cancelled" for r in results)
        assert _init_depth(svc) == 0
    finally:
        svc.stop()


def test_a_cancel_while_the_pool_takes_the_jobs_messages_loses_nothing(tmp_path, backend):
    """The purge scans lists the INIT pool is taking from: each rollout of the cancelled job
    ends once (completed before the cancel, or cancelled), and the job queued behind it loses
    nothing."""
    svc = start_service(tmp_path, **backend, concurrency={"init": 4, "run": 2, "eval": 2})
    try:
        n = 1500
        busy = svc.client.submit("test-trivial", [{"instance_id": f"i{k:04d}"} for k in range(n)])
        behind = svc.client.submit("test-trivial", [{"instance_id": f"b{k}"} for k in range(50)])
        wait_for(lambda: svc.client.job(busy.job_id).finished >= 20, 120, "the pool taking the job")
        svc.client.cancel(busy.job_id)  # while INIT claims its rollouts

        final = svc.wait_done(busy.job_id, timeout=120)
        results = svc.all_results(busy.job_id)
        assert [r.seq for r in results] == list(range(1, n + 1))
        assert len({r.rollout_id for r in results}) == n
        outcomes = final.outcomes
        assert set(outcomes) <= {"completed", "cancelled"} and outcomes.get("cancelled", 0) > n // 2
        assert all(r.reward == 1.0 and r.response_ids == [1] for r in results if r.outcome == "completed")
        others = svc.wait_done(behind.job_id, timeout=120)
        assert others.outcomes == {"completed": 50}
        assert all(r.reward == 1.0 for r in svc.all_results(behind.job_id))
        wait_for(lambda: _init_depth(svc) == 0, 30, "the INIT queue empty")
    finally:
        svc.stop()


def test_when_the_cancels_purge_fails_the_workers_drop_and_purge(tmp_path, backend, caplog):
    """Redis unreachable from the cancel (its purge fails, logged): the cancel still holds,
    and the first INIT worker that meets a stale message purges the job's others."""
    from app.jobs import cancel_job
    from core.settings import Settings
    from tasks.celery_app import make_celery

    svc = start_service(tmp_path, **backend, concurrency={"init": 2, "run": 2, "eval": 2})
    dead = make_celery(Settings(home=tmp_path / "dead", broker_url="redis://127.0.0.1:1/0"))
    dead.conf.broker_connection_timeout = 1.0
    try:
        n = 100 * N_SAMPLES
        big = svc.client.submit(
            "test-sleepy",
            [{"instance_id": f"i{k:03d}"} for k in range(100)],
            n_samples=N_SAMPLES,
            agent_config={"init_s": 1.0, "run_s": 20.0, "turns": 20},
        )
        wait_for(lambda: _unpublished(svc, big.job_id) == 0, 120, "the job published")
        view = cancel_job(svc.settings, big.job_id, celery=dead)
        assert view.counts.get("cancelled", 0) > n - 50
        assert "stay in the broker" in caplog.text  # the cancel's purge failed, the cancel holds

        t0 = time.monotonic()
        nxt = svc.client.submit("test-trivial", [{"instance_id": "next"}])
        assert svc.wait_done(nxt.job_id, timeout=60).outcomes == {"completed": 1}
        took = time.monotonic() - t0
        assert took < 20, f"the next job took {took:.1f}s"
        final = svc.wait_done(big.job_id, timeout=90)
        assert final.counts == {"cancelled": n}
        assert [r.seq for r in svc.all_results(big.job_id)] == list(range(1, n + 1))
        wait_for(lambda: _init_depth(svc) == 0, 30, "the INIT queue empty")
        purged = re.findall(r"removed (\d+) queued INIT messages", (svc.logs / "init-node-a.log").read_text())
        assert sum(map(int, purged)) > n // 2  # most left in one pass, not one delivery each
    finally:
        dead.close()
        svc.stop()
