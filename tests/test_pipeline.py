"""The whole pipeline with real Celery worker processes, on both backends."""

from __future__ import annotations

import pytest

from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`


@pytest.fixture(params=["embedded", "redis+postgresql"])
def service(request, tmp_path):
    """A running service on the embedded default or on Redis + PostgreSQL."""
    if request.param == "embedded":
        svc = start_service(tmp_path)
    else:
        from tests.conftest import REDIS_URL

        svc = start_service(
            tmp_path,
            db_url=request.getfixturevalue("pg_url"),
            broker_url=REDIS_URL,
            key_prefix=request.getfixturevalue("redis_prefix"),
        )
    yield svc
    svc.stop()


def instances(n: int) -> list[dict]:
    return [{"instance_id": f"i{k}", "data": {"k": k}} for k in range(n)]


def test_batch_runs_every_rollout_to_done_with_groups(service) -> None:
    accepted = service.client.submit("test-sleepy", instances(5), n_samples=3, agent_config={"turns": 2})
    assert len(accepted.rollout_ids) == 15
    job = service.wait_done(accepted.job_id)
    assert job.counts == {"done": 15} and job.outcomes == {"completed": 15}
    results = service.all_results(accepted.job_id)
    assert [r.seq for r in results] == list(range(1, 16))
    assert sorted(r.rollout_id for r in results) == sorted(accepted.rollout_ids)
    # every instance's group completes exactly once, on its last sample to finish
    closers = [r for r in results if r.group_complete]
    assert sorted(r.instance_id for r in closers) == [f"i{k}" for k in range(5)]
    for r in closers:
        seqs = [x.seq for x in results if x.instance_id == r.instance_id]
        assert r.seq == max(seqs)
    assert {r.reward for r in results} == {0.0, 1.0}
    assert all(r.response_ids == [4, 5] and r.loss_mask == [1, 1] for r in results)
    detail = service.client.rollout(results[0].rollout_id)
    assert [t.index for t in detail.turns] == [0, 1]
    assert detail.timing.init is not None and detail.timing.eval is not None
    # fetching twice returns the same data
    assert service.all_results(accepted.job_id) == results


def test_sqlite_takes_concurrent_writers_without_locking_errors(tmp_path):
    """Gateway, three pools of 4 threads and the reaper all write one SQLite file at once."""
    svc = start_service(tmp_path, concurrency=4)
    try:
        jobs = [
            svc.client.submit("test-sleepy", instances(50), n_samples=2, agent_config={"turns": 3}) for _ in range(2)
        ]
        for job in jobs:
            assert svc.wait_done(job.job_id, timeout=120).counts == {"done": 100}
        logs = svc.log_tail(lines=100_000)
        assert "database is locked" not in logs and "Traceback" not in logs
    finally:
        svc.stop()
