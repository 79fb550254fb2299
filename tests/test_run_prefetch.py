"""RUN holds `run_prefetch` messages past its slots (`tasks.acks.StageConsumer`): a real RUN
worker of two slots, real Redis and PostgreSQL. With the default (1), of five rollouts queued
for RUN two run, one waits in the worker and two in the broker; with 0, three wait in the
broker. Either way every rollout completes with its reward."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from core.db import session_scope
from core.models import Rollout
from tasks.config import stage_queue
from tasks.queues import queue_depths
from tests.conftest import REDIS_URL
from tests.pipeline_harness import start_service, wait_for

pytestmark = pytest.mark.service


def _running(db: str, job: str) -> int:
    with session_scope(db) as s:
        return s.scalar(
            sa.select(sa.func.count())
            .select_from(Rollout)
            .where(Rollout.job_id == job, Rollout.status == "run", Rollout.lease_owner.is_not(None))
        )


@pytest.mark.parametrize(("prefetch", "in_broker"), [(1, 2), (0, 3)])
def test_a_run_worker_holds_run_prefetch_messages_past_its_slots(tmp_path, pg_url, redis_prefix, prefetch, in_broker):
    svc = start_service(
        tmp_path,
        db_url=pg_url,
        broker_url=REDIS_URL,
        key_prefix=redis_prefix,
        concurrency={"init": 4, "run": 2, "eval": 2},
        extra={"run_prefetch": prefetch},
    )
    try:
        celery = svc._server.app.extensions["celery"]
        queue = stage_queue("run", svc.settings.node)
        job = svc.client.submit(
            "test-sleepy", [{"instance_id": f"i{k}"} for k in range(5)], agent_config={"run_s": 4, "turns": 2}
        )["job_id"]
        wait_for(lambda: _running(svc.settings.db_url, job) == 2, timeout=60, what="two RUNs")
        wait_for(lambda: queue_depths(celery, [queue])[queue] == in_broker, timeout=30, what=f"{in_broker} queued")
        assert _running(svc.settings.db_url, job) == 2  # the held message waits for a slot
        done = svc.wait_done(job, timeout=120)
        assert done["outcomes"] == {"completed": 5}, done
        results = svc.all_results(job)
        assert len({r["rollout_id"] for r in results}) == 5 == len(results)
        assert all(r["reward"] == float(r["sample_index"] % 2) for r in results)
    finally:
        svc.stop()
