"""`raas node` (issue 26.2, 27): one supervised unit per node, a bounded drain on SIGTERM that
hands back what it holds, and a node whose EVAL pool is gone takes no INIT work. Real
`raas node` processes, real Celery pools, real Redis and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import sqlalchemy as sa

from core.db import session_scope
from core.models import QueueConsumer, Rollout
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import REPO, _as_env, start_service, wait_for, Service
import pytest

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

SOFT = 4.0  # RAAS_SOFT_SHUTDOWN_TIMEOUT of the drained node


def _node(svc, name: str, *args: str, **env: object) -> subprocess.Popen:
    """`raas node NAME ...` with the service's settings, logging to logs/node-NAME.log."""
    log = open(svc.logs / f"node-{name}.log", "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "app.ops.cli", "node", "--node", name, *args],
        env={**svc.env, **_as_env(env)},
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _consumers(db: str, node: str) -> dict[str, int]:
    with session_scope(db) as s:
        return dict(
            s.execute(sa.select(QueueConsumer.queue, QueueConsumer.pid).where(QueueConsumer.node == node)).all()
        )


def _rows(db: str, job_id: str) -> list[Rollout]:
    with session_scope(db) as s:
        rows = s.scalars(sa.select(Rollout).where(Rollout.job_id == job_id)).all()
        s.expunge_all()
        return list(rows)


def _service(tmp_path, pg_url, redis_prefix, **extra) -> Service:
    return start_service(
        tmp_path,
        db_url=pg_url,
        broker_url=REDIS_URL,
        key_prefix=redis_prefix,
        nodes=("n1",),
        stages=(),
        reaper=False,
        extra={"node_timeout": 6.0, **extra},
    )


def test_sigterm_mid_run_drains_within_the_timeout_and_hands_back(tmp_path, pg_url, redis_prefix):
    """SIGTERM to n1's node command while it holds RUNs that cannot finish in time, RUNs that
    finish during the drain, and EVALs still grading at the deadline: it exits 0 within the
    timeout + a few seconds; the long RUNs restart from INIT on n2 at once (no lease
    timeout), the finished RUNs are graded (on n1 or n2) and never re-run; rewards right,
    nothing lost or duplicated."""
    svc = _service(tmp_path, pg_url, redis_prefix)
    db = svc.settings.db_url
    n1 = _node(svc, "n1", "--init", "2", "--run", "4", "--eval", "1", soft_shutdown_timeout=SOFT)
    # n2 takes no INIT work before n1 drains (its INIT pool starts after the signal)
    n2 = _node(svc, "n2", "--init", "0", "--run", "4", "--eval", "2", "--no-reaper")
    try:
        wait_for(lambda: len(_consumers(db, "n1")) == 3, timeout=60, what="n1's three pools")
        wait_for(lambda: len(_consumers(db, "n2")) == 2, timeout=60, what="n2's RUN and EVAL")
        # finishes RUN ~2 s into the drain; two EVALs of 5 s: one runs past the deadline
        short = svc.client.submit(
            "test-sleepy",
            [{"instance_id": f"s{k}"} for k in range(2)],
            agent_config={"run_s": 3, "turns": 3, "eval_s": 5},
        )
        long = svc.client.submit(
            "test-sleepy",
            [{"instance_id": f"l{k}"} for k in range(2)],
            agent_config={"run_s": 60, "turns": 6, "retry_run_s": 1},
        )

        def all_in_run() -> bool:
            rows = _rows(db, short.job_id) + _rows(db, long.job_id)
            return all(r.status == "run" and r.lease_owner for r in rows)

        wait_for(all_in_run, timeout=60, what="four rollouts in RUN on n1", interval=0.05)
        time.sleep(1.0)  # the long ones log a turn or two
        sent = time.monotonic()
        n1.send_signal(signal.SIGTERM)
        svc.start_worker("init", "n2", 2)
        code = n1.wait(SOFT + 20)
        took = time.monotonic() - sent
        assert code == 0, svc.log_tail()
        assert took < SOFT + 8, took
        # what n1 held is not waiting for a lease timeout: nothing is leased by n1 any more
        left = [
            r
            for r in _rows(db, short.job_id) + _rows(db, long.job_id)
            if (r.lease_owner or "").startswith("n1/") or (r.node == "n1" and r.finished_at is None)
        ]
        assert left == [], [(r.id, r.status, r.node, r.lease_owner) for r in left]
        assert not _consumers(db, "n1")
        for job, n in ((short, 2), (long, 2)):
            done = svc.wait_done(job.job_id, timeout=150)
            assert done.outcomes == {"completed": n}, done
        short_results = svc.all_results(short.job_id)
        long_results = svc.all_results(long.job_id)
        for r in short_results + long_results:
            assert r.reward == float(r.sample_index % 2), r
        assert len({r.rollout_id for r in short_results}) == 2 == len(short_results)
        assert len({r.rollout_id for r in long_results}) == 2 == len(long_results)
        for r in short_results:  # RUN finished on n1 during the drain: graded, not re-run
            where = r.extra["where"]
            assert r.attempt == 1 and where["run"]["node"] == "n1", r
        evals = {r.extra["where"]["eval"]["node"] for r in short_results}
        assert "n2" in evals, short_results  # the EVAL still grading at the deadline moved
        for r in long_results:  # could not finish in time: a new attempt, all of it on n2
            where = r.extra["where"]
            assert r.attempt == 2 and where["init"]["node"] == where["run"]["node"] == "n2"
            [earlier] = svc.client.rollout(r.rollout_id).earlier_attempts
            assert "drains" in earlier.error, earlier
    finally:
        for proc in (n1, n2):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        svc.stop()


def test_a_node_whose_eval_pool_died_takes_no_init_work(tmp_path, pg_url, redis_prefix):
    """n1's EVAL pool is killed and cannot come back (its supervisor is gone too): n1's INIT
    stops consuming, so a job submitted then runs entirely on n2; nothing waits for eval.n1."""
    svc = _service(tmp_path, pg_url, redis_prefix)
    db = svc.settings.db_url
    try:
        for node in ("n1", "n2"):
            for stage in ("init", "run", "eval"):
                svc.start_worker(stage, node, 2)
        for node in ("n1", "n2"):
            wait_for(lambda n=node: len(_consumers(db, n)) == 3, timeout=60, what=f"{node}'s pools")
        svc.kill_worker("eval", "n1")
        wait_for(
            lambda: "INIT takes no new work" in (svc.logs / "init-n1.log").read_text(),
            timeout=30,
            what="n1's INIT gate to close",
        )
        job = svc.client.submit(
            "test-sleepy", [{"instance_id": f"i{k}"} for k in range(6)], agent_config={"run_s": 0.5, "turns": 2}
        )
        done = svc.wait_done(job.job_id, timeout=120)
        assert done.outcomes == {"completed": 6}, done
        results = svc.all_results(job.job_id)
        for r in results:
            where = r.extra["where"]
            assert where["init"]["node"] == where["eval"]["node"] == "n2", r
            assert r.attempt == 1 and r.reward == float(r.sample_index % 2), r
    finally:
        svc.stop()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" in f.read()
    except FileNotFoundError:
        return True


def test_a_dead_pool_is_restarted_and_pools_die_with_the_node(tmp_path, pg_url, redis_prefix):
    """A pool that dies is started again (new pid, a log line saying how it ended); when the
    node command itself is SIGKILLed, its pools get their parent-death signal and exit."""
    svc = _service(tmp_path, pg_url, redis_prefix)
    db = svc.settings.db_url
    node = _node(svc, "n1", "--init", "1", "--run", "1", "--eval", "1", "--no-reaper")
    try:
        pids = wait_for(lambda: len(_consumers(db, "n1")) == 3 and _consumers(db, "n1"), timeout=60, what="n1's pools")
        os.kill(pids["eval.n1"], signal.SIGKILL)
        new = wait_for(
            lambda: _consumers(db, "n1").get("eval.n1") not in (None, pids["eval.n1"]) and _consumers(db, "n1"),
            timeout=60,
            what="a new EVAL pool",
        )
        log = (svc.logs / "node-n1.log").read_text()
        assert f"EVAL pool (pid {pids['eval.n1']}) exited with signal SIGKILL" in log
        node.kill()  # no drain, no hand-back: the pools must not outlive it
        node.wait(10)
        wait_for(
            lambda: all(_gone(pid) for pid in new.values()), timeout=30, what="the pools to die with their node command"
        )
    finally:
        if node.poll() is None:
            node.kill()
        svc.stop()


def test_a_node_on_the_embedded_default_starts_its_broker_and_works(tmp_path):
    """`raas node` against an embedded home (no RAAS_BROKER_URL): it finds the home's Redis
    (started here by the gateway) or starts it, its pools run a job, SIGTERM exits 0."""
    from core.settings import embedded_redis_socket
    from tasks.broker import embedded_redis

    svc = start_service(tmp_path, nodes=("n1",), stages=(), reaper=False)
    embedded_redis.stop(svc.settings)  # the node must start it itself
    node = _node(svc, "n1", "--init", "1", "--run", "1", "--eval", "1")
    try:
        wait_for(
            lambda: embedded_redis.answers(embedded_redis_socket(tmp_path)),
            timeout=60,
            what="the node's embedded Redis",
        )
        job = svc.client.submit("test-sleepy", [{"instance_id": f"e{k}"} for k in range(3)])
        done = svc.wait_done(job.job_id, timeout=120)
        assert done.outcomes == {"completed": 3}, done
        assert embedded_redis.answers(embedded_redis_socket(tmp_path))
        node.send_signal(signal.SIGTERM)
        assert node.wait(60) == 0, svc.log_tail()
        assert embedded_redis.answers(embedded_redis_socket(tmp_path))  # left for the gateway
    finally:
        if node.poll() is None:
            node.kill()
        svc.stop()


def test_a_pool_past_max_slots_per_process_runs_as_several_processes(tmp_path, pg_url, redis_prefix):
    """`--run 4` at `max_slots_per_process` 2: two RUN processes of two slots each, both
    consuming the node's RUN queue; four rollouts run at once (one process holds two), all
    complete with the right rewards, and a SIGTERM drains both processes."""
    svc = _service(tmp_path, pg_url, redis_prefix)
    db = svc.settings.db_url
    node = _node(svc, "n1", "--init", "2", "--run", "4", "--eval", "2", max_slots_per_process=2)
    try:

        def run_pids() -> set[int]:
            with session_scope(db) as s:
                rows = s.execute(sa.select(QueueConsumer.queue, QueueConsumer.pid).where(QueueConsumer.node == "n1"))
                return {pid for queue, pid in rows if queue.startswith("run")}

        wait_for(lambda: len(run_pids()) == 2, timeout=60, what="two RUN processes")
        job = svc.client.submit(
            "test-sleepy", [{"instance_id": f"p{k}"} for k in range(4)], agent_config={"run_s": 3, "turns": 3}
        )

        def holders() -> set[str]:
            rows = _rows(db, job.job_id)
            return {r.lease_owner.split("/")[1] for r in rows if r.status == "run" and r.lease_owner}

        wait_for(lambda: len(holders()) == 2, timeout=60, what="RUNs held by both processes", interval=0.05)
        assert {int(pid) for pid in holders()} == run_pids()
        done = svc.wait_done(job.job_id, timeout=90)
        assert done.outcomes == {"completed": 4}, done
        results = svc.all_results(job.job_id)
        assert len({r.rollout_id for r in results}) == 4 == len(results)
        for r in results:
            assert r.reward == float(r.sample_index % 2), r
        node.send_signal(signal.SIGTERM)
        assert node.wait(30) == 0
        assert not _consumers(db, "n1")
    finally:
        if node.poll() is None:
            node.kill()
        svc.stop()
