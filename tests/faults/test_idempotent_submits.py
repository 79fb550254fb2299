"""16 trainers submit the same job with one idempotency key at once, across two gateways
(the harness's in-process gateway and a `raas gateway` process) on Redis + PostgreSQL: one
job is made, every answer lists the same rollout ids in the same order, a 17th submission with
another body is refused naming the difference, and the job runs each rollout exactly once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from raas_client import RaasClient, RaasHTTPError
from tests.conftest import REDIS_URL
from tests.faults.test_trainer_waits import GatewayProcess, free_port
from bench.support.pipeline_harness import start_service
from raas_client.models import JobAccepted

SUBMITTERS = 16
INSTANCES = [{"instance_id": f"p{i}"} for i in (7, 3, 11, 0, 5, 9)]  # not in sorted order


def test_concurrent_submits_with_one_key_across_two_gateways(tmp_path, pg_url, redis_prefix):
    svc = start_service(tmp_path, db_url=pg_url, broker_url=REDIS_URL, key_prefix=redis_prefix, concurrency=2)
    second = GatewayProcess(svc, free_port())
    try:
        second.start()
        urls = [svc.url, second.url]
        start = threading.Barrier(SUBMITTERS)

        def submit(n: int) -> JobAccepted:
            with RaasClient(urls[n % 2], retry_total=30) as client:
                start.wait(30)  # all at once, half on each gateway
                return client.submit(
                    "test-sleepy", INSTANCES, n_samples=2, agent_config={"run_s": 0.1}, idempotency_key="epoch-7"
                )

        with ThreadPoolExecutor(SUBMITTERS) as pool:
            answers = list(pool.map(submit, range(SUBMITTERS)))

        assert len({a.job_id for a in answers}) == 1
        assert sum(a.created for a in answers) == 1
        ids = answers[0].rollout_ids
        assert len(ids) == len(INSTANCES) * 2 and all(a.rollout_ids == ids for a in answers)
        order = [(svc.client.rollout(r).instance_id, svc.client.rollout(r).sample_index) for r in ids]
        assert order == [(i["instance_id"], k) for i in INSTANCES for k in (0, 1)]
        assert len(svc.client.jobs().jobs) == 1

        with pytest.raises(RaasHTTPError) as refused:
            svc.client.submit(
                "test-sleepy", INSTANCES, n_samples=3, agent_config={"run_s": 0.1}, idempotency_key="epoch-7"
            )
        assert refused.value.status == 409
        assert "n_samples 3 (the job has 2)" in str(refused.value)

        job = svc.wait_done(answers[0].job_id, timeout=120)
        assert job.counts == {"done": len(ids)}
        results = svc.all_results(job.job_id)
        assert sorted(r.rollout_id for r in results) == sorted(ids)
        assert [r.seq for r in results] == list(range(1, len(ids) + 1))
        assert all(r.reward == float(r.sample_index % 2) for r in results)
    finally:
        second.kill()
        svc.stop()
