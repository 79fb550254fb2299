"""Faults at a hand-off, with real workers: a broker outage (a private Redis stopped and
restarted) during INIT->RUN or RUN->EVAL costs no rollout a re-run; a SIGKILLed INIT worker
mid-start (real bwrap) leaves no process and no folder behind once the reaper passed.
"""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

from core.db import session_scope
from core.models import Rollout, Turn
from sandbox.handles import orphaned, pid_alive, read_handles, unclaimed
from sandbox.toolserver.procs import descendants, start_time
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import start_service, wait_for


# -- pipeline: a broker outage during a hand-off -------------------------------------------------


def _in_stage_with(db: str, job_id: str, stage: str, need_turn: bool):
    def check() -> bool:
        with session_scope(db) as s:
            rows = s.scalars(sa.select(Rollout).where(Rollout.job_id == job_id)).all()
            turns = s.scalar(
                sa.select(sa.func.count())
                .select_from(Turn)
                .join(Rollout, Rollout.id == Turn.rollout_id)
                .where(Rollout.job_id == job_id)
            )
        ready = [r for r in rows if r.status == stage and r.lease_owner and (r.sandbox or {}).get("workspace")]
        return len(ready) == len(rows) and (turns >= len(rows) or not need_turn)

    return check


@pytest.mark.parametrize(
    "stage,budget,downtime",
    [
        ("init", 15.0, 3.0),  # INIT -> RUN; kombu's retries outlast the outage
        ("run", 0.5, 4.0),  # RUN -> EVAL; the outage outlasts them: the outbox publishes it
    ],
    ids=["retried-init-to-run", "deferred-run-to-eval"],
)
def test_a_broker_outage_during_a_hand_off_costs_no_rerun(stage, budget, downtime, tmp_path, pg_url, private_redis):
    svc = start_service(
        tmp_path,
        db_url=pg_url,
        broker_url=private_redis.url,
        extra={"handoff_publish_seconds": budget, "outbox_grace": 2.0, "sandbox_dir": str(tmp_path / "sandboxes")},
    )
    try:
        job = svc.client.submit(
            "test-sandboxed",
            [{"instance_id": "a"}],
            n_samples=2,
            agent_config={"init_s": 2.5 if stage == "init" else 0, "run_s": 2.5 if stage == "run" else 0, "turns": 2},
        )
        wait_for(
            _in_stage_with(svc.settings.db_url, job.job_id, stage, stage == "run"),
            60,
            f"both rollouts in {stage} with their sandbox",
        )
        private_redis.restart(downtime=downtime)  # the hand-off comes while it is down
        svc.wait_done(job.job_id, timeout=90)
        results = sorted(svc.all_results(job.job_id), key=lambda r: r.sample_index)
        assert [(r.status, r.outcome, r.attempt, r.reward) for r in results] == [
            ("done", "completed", 1, 0.0),
            ("done", "completed", 1, 1.0),
        ]
        with session_scope(svc.settings.db_url) as s:
            turns = s.execute(sa.select(Turn.rollout_id, Turn.attempt, Turn.index)).all()
            marks = s.scalar(sa.select(sa.func.count()).select_from(Rollout).where(Rollout.outbox_at.is_not(None)))
        assert sorted((t.attempt, t.index) for t in turns) == [(1, 0), (1, 0), (1, 1), (1, 1)]
        assert marks == 0
        log = (svc.logs / f"{stage}-node-a.log").read_text()
        assert "ends rollout: failed" not in log and "keeps the sandbox" not in log
        deferred = log.count(f"handed to {'run' if stage == 'init' else 'eval'}; publish deferred to the outbox")
        assert deferred == (0 if budget > downtime else 2), svc.log_tail()
    finally:
        svc.stop()


# -- pipeline: a SIGKILLed INIT worker mid-start ------------------------------------------------


def test_a_sigkilled_init_worker_mid_start_leaks_nothing(tmp_path, pg_url, redis_prefix):
    sandbox_dir = tmp_path / "sandboxes"
    svc = start_service(
        tmp_path,
        db_url=pg_url,
        broker_url=REDIS_URL,
        key_prefix=redis_prefix,
        concurrency=1,
        extra={"sandbox_dir": str(sandbox_dir)},
    )
    try:
        job = svc.client.submit("test-sandboxed", [{"instance_id": "a"}])
        rid = job.rollout_ids[0]

        def launched():  # the intent record with the launcher's pid, before the sandbox is ready
            found = [
                h
                for h in (read_handles(sandbox_dir) if sandbox_dir.exists() else [])
                if h.get("label") == f"{rid}:1" and h.get("pid")
            ]
            return found[0] if found else None

        intent = wait_for(launched, 60, "INIT launching the sandbox", interval=0.002)
        svc.kill_worker("init", "node-a")
        assert intent["state"] == "starting", "the start finished before the kill"
        launcher = intent["pid"]
        tree = [launcher, *descendants(launcher)]
        starts = {pid: start_time(pid) for pid in tree}
        svc.start_worker("init", "node-a", 1)
        svc.wait_done(job.job_id, timeout=90)
        [result] = svc.all_results(job.job_id)
        assert (result.outcome, result.attempt, result.reward) == ("completed", 2, 0.0)
        wait_for(
            lambda: not any(pid_alive(p, starts[p]) for p in tree), 10, "the orphaned sandbox's processes to be killed"
        )

        # What is left is the new INIT worker's warm pool (sandbox/pool.py), nothing else: the
        # killed worker's start and its pool's members are gone with their state and folders.
        def leftovers() -> list[str]:
            warm = [h for h in read_handles(sandbox_dir) if unclaimed(h) and not orphaned(h)]
            assert all(h["owner_pid"] == svc.workers[("init", "node-a")].pid for h in warm)
            ids = {h["id"] for h in warm}
            slots = {os.path.basename(h["workspace"]) for h in warm}
            return [name for name in os.listdir(sandbox_dir) if name.split(".")[0] not in ids] + [
                name for name in os.listdir(svc.settings.workspaces) if name not in slots
            ]

        wait_for(
            lambda: leftovers() == [],
            30,
            "the sandbox state and workspaces to be removed",
            context=lambda: f"left: {leftovers()}; handles: {read_handles(sandbox_dir)}",
        )
    finally:
        svc.stop()
