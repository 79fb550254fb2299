"""Warm sandboxes in the pipeline: INIT and EVAL claim pre-started sandboxes from their
process's pool (real Celery workers, real bwrap), the work is real (the agent answers in its
sandbox, the grader checks it in a fresh one), and a killed worker's pool is reaped."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from sandbox.handles import POOL_LABEL, orphaned, pid_alive, read_handles
from sandbox.toolserver.procs import descendants, start_time
from bench.support.pipeline_harness import start_service, wait_for
from raas_client.models import RolloutView

pytestmark = pytest.mark.service


@pytest.fixture
def sandbox_dir():
    """A private, short (socket paths) sandbox state folder for the service's workers."""
    path = tempfile.mkdtemp(prefix="raas-warm-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _members(sandbox_dir: str) -> list[dict]:
    """Unclaimed pool members that are ready, on disk (what the reaper sees)."""
    return [h for h in read_handles(Path(sandbox_dir)) if h.get("label") == POOL_LABEL and h.get("state") == "ready"]


def _graded(svc, n: int) -> list[RolloutView]:
    job = svc.client.submit("test-graded", [{"instance_id": f"i{k}"} for k in range(n)])
    svc.wait_done(job.job_id, timeout=120)
    results = svc.all_results(job.job_id)
    for r in results:  # the work was real in every sandbox, warm or cold
        assert (r.outcome, r.reward) == ("completed", 1.0), r
        assert r.extra["run_saw"] == "answer question"
        assert r.extra["eval_saw"] == "answer"  # a fresh grading sandbox: nothing of RUN's
        assert r.extra["eval_uid"] == "65534" or os.geteuid() != 0
    return results


def test_init_and_eval_take_warm_sandboxes(tmp_path, sandbox_dir):
    svc = start_service(tmp_path, concurrency=2, extra={"sandbox_dir": sandbox_dir})
    try:
        first = _graded(svc, 2)  # cold: the pools learn the shapes from these misses
        assert all(not r.extra["init_ws"].startswith("pool-") for r in first)
        # two INIT members and two EVAL members (the grading shape differs: no network,
        # big output) are started ahead of the next job
        wait_for(lambda: len(_members(sandbox_dir)) >= 4, 60, "warm INIT and EVAL sandboxes")
        owners = {h["owner_pid"] for h in _members(sandbox_dir)}
        assert len(owners) == 2  # one pool per stage process
        warm = _graded(svc, 2)
        assert all(r.extra["init_ws"].startswith("pool-") for r in warm), warm
        assert all(r.extra["eval_ws"].startswith("pool-") for r in warm), warm
        used = {r.extra["init_ws"] for r in first + warm} | {r.extra["eval_ws"] for r in first + warm}
        assert len(used) == 8  # one sandbox, one workspace, one stage of one rollout
        for name in used:  # released with their rollouts
            assert not (svc.settings.workspaces / name).exists()
    finally:
        svc.stop()
    # a stopped worker's pool stops its members and deletes their slots
    assert read_handles(Path(sandbox_dir)) == []
    assert [p for p in os.listdir(svc.settings.workspaces) if p.startswith("pool-")] == []


def test_a_killed_workers_pool_is_reaped_and_the_next_worker_warms_again(tmp_path, sandbox_dir):
    svc = start_service(tmp_path, concurrency=2, extra={"sandbox_dir": sandbox_dir})
    try:
        _graded(svc, 1)
        wait_for(lambda: len(_members(sandbox_dir)) >= 4, 60, "warm INIT and EVAL sandboxes")
        init_pid = svc.workers[("init", "node-a")].pid
        doomed = [h for h in _members(sandbox_dir) if h["owner_pid"] == init_pid]
        kept = [h for h in _members(sandbox_dir) if h["owner_pid"] != init_pid]
        assert len(doomed) == 2 and len(kept) == 2
        trees = {h["id"]: [h["pid"], *descendants(h["pid"])] for h in doomed}
        starts = {p: start_time(p) for tree in trees.values() for p in tree}
        svc.kill_worker("init", "node-a")  # SIGKILL: no atexit, no cleanup of its own
        assert all(orphaned(h) for h in doomed) and not any(orphaned(h) for h in kept)
        # the node's reaper (a thread of this service, every 0.5 s) stops them
        wait_for(
            lambda: not any(pid_alive(p, starts[p]) for tree in trees.values() for p in tree),
            30,
            "the dead pool's sandboxes stopped",
        )
        wait_for(
            lambda: not any(Path(h["workspace"]).exists() for h in doomed), 30, "the dead pool's slot folders removed"
        )
        live = {h["id"] for h in read_handles(Path(sandbox_dir))}
        assert {h["id"] for h in kept} <= live  # the live EVAL pool's members stay
        svc.start_worker("init", "node-a", 2)
        _graded(svc, 1)  # the new INIT process learns the shape again
        wait_for(lambda: len(_members(sandbox_dir)) >= 4, 60, "warm again")
        assert _graded(svc, 1)[0].extra["init_ws"].startswith("pool-")
    finally:
        svc.stop()
    assert read_handles(Path(sandbox_dir)) == []
