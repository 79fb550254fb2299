"""Pausing a job (issue 37), through the real gateway and real worker pools on both backends:
while paused, no queued rollout of the job is claimed (the INIT claim refuses it, the reaper's
stale-queue sweep leaves it waiting for longer than its `requeue_after`), the rollouts that
had started finish, a job submitted meanwhile runs; the resume queues the waiting ones again and
every rollout ends once with its reward and tokens."""

from __future__ import annotations

import time

import httpx
import pytest
import sqlalchemy as sa

from bench.support.pipeline_harness import start_service, wait_for
from core.db import session_scope
from core.models import Rollout
from tests import test_bulk_submit as bulk

backend = bulk.backend  # the fixture: each test on the embedded default and on Redis + PostgreSQL

pytestmark = pytest.mark.service

N = 16


def _started(svc, job_id: str) -> int:
    """Rollouts of the job that were ever claimed by INIT (their stage clock is set)."""
    with session_scope(svc.settings.db_url) as s:
        return s.scalar(
            sa.select(sa.func.count())
            .select_from(Rollout)
            .where(Rollout.job_id == job_id, Rollout.stage_started_at.is_not(None))
        )


def test_a_paused_job_starts_nothing_until_resumed(tmp_path, backend):
    svc = start_service(tmp_path, **backend, concurrency={"init": 1, "run": 2, "eval": 1})
    try:
        job = svc.client.submit(
            "test-sleepy",
            [{"instance_id": f"i{k:02d}"} for k in range(N)],
            n_samples=2,
            agent_config={"init_s": 0.3, "run_s": 0.3, "turns": 2},
        )
        wait_for(lambda: _started(svc, job.job_id) >= 1, 30, "the first rollout started")
        view = svc.client.pause(job.job_id)
        assert view.status == "paused" and view.paused_at is not None and "paused by" in view.pause_reason
        assert svc.client.pause(job.job_id).paused_at == view.paused_at  # a second pause changes nothing
        started = _started(svc, job.job_id)
        assert started < 2 * N  # the pause caught queued rollouts

        # what had started finishes; nothing else starts, for longer than the stale-queue sweep's
        # `requeue_after` (3 s here) with the reaper running
        def in_flight() -> int:
            counts = svc.client.job(job.job_id).counts
            return sum(counts.get(stage, 0) for stage in ("init", "run", "eval"))

        wait_for(lambda: in_flight() == 0, 30, "the started rollouts to finish")
        held = _started(svc, job.job_id)
        assert held <= started + 1  # at most the one INIT slot's claim racing the pause's commit
        assert svc.client.job(job.job_id).counts.get("pending", 0) == 2 * N - held
        time.sleep(svc.settings.requeue_after + 3)
        assert _started(svc, job.job_id) == held
        paused = svc.client.job(job.job_id)
        assert paused.status == "paused" and paused.counts["pending"] == 2 * N - held

        # another job is not held behind it
        other = svc.client.submit("test-trivial", [{"instance_id": "other"}])
        assert svc.wait_done(other.job_id, timeout=60).outcomes == {"completed": 1}

        resumed = svc.client.resume(job.job_id)
        assert resumed.status == "running" and resumed.paused_at is None and resumed.pause_reason is None
        done = svc.wait_done(job.job_id, timeout=120)
        assert done.status == "done" and done.outcomes == {"completed": 2 * N}
        results = svc.all_results(job.job_id)
        assert len({r.rollout_id for r in results}) == 2 * N
        assert [r.seq for r in results] == list(range(1, 2 * N + 1))
        assert all(r.reward == float(r.sample_index % 2) for r in results)
        assert all(r.response_ids == [4, 5] and r.prompt_ids == [1, 2, 3] for r in results)
        assert all(r.attempt == 1 for r in results)  # parked, not failed and retried
    finally:
        svc.stop()


def test_pause_and_resume_answer_clearly(tmp_path):
    svc = start_service(tmp_path, concurrency=1)
    try:
        job = svc.client.submit("test-trivial", [{"instance_id": "a"}])
        svc.wait_done(job.job_id, timeout=60)
        with httpx.Client(base_url=svc.url) as http:
            finished = http.post(f"/v1/jobs/{job.job_id}/pause")
            assert finished.status_code == 409 and "finished: nothing to pause" in finished.text
            assert http.post("/v1/jobs/nope/pause").status_code == 404
            assert http.post("/v1/jobs/nope/resume").status_code == 404
            # resuming a job that is not paused changes nothing
            again = http.post(f"/v1/jobs/{job.job_id}/resume")
            assert again.status_code == 200 and again.json()["status"] == "done"
        # the command line, with the dashboard's short id
        from click.testing import CliRunner

        from raas_client.cli import pause, resume

        short = job.job_id[:12]
        refused = CliRunner().invoke(pause, [short, "--url", svc.url])
        assert refused.exit_code != 0 and "nothing to pause" in refused.output
        said = CliRunner().invoke(resume, [short, "--url", svc.url])
        assert said.exit_code == 0 and said.output.startswith(f"{job.job_id}  done  1/1"), said.output
    finally:
        svc.stop()
