"""Node liveness, queue consumers, racing reapers and workers that survive the broker, with
real worker processes, real Redis and PostgreSQL (issue 15: node loss, one reaper per row,
a consumer that dies ends its process non-zero)."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from datetime import timedelta

import pytest
import redis
import sqlalchemy as sa

from core.db import session_scope
from core.models import Job, Node, QueueConsumer, Rollout, utcnow
from core.settings import Settings
from migrations.runner import upgrade
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import FAST_RELIABILITY, start_service
from bench.support.waiting import wait_for

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`


@pytest.fixture
def redis_pg(tmp_path, pg_url, redis_prefix):
    """Keyword arguments for a Redis + PostgreSQL service."""
    return {"db_url": pg_url, "broker_url": REDIS_URL, "key_prefix": redis_prefix}


def queue_depth(prefix: str, queue: str) -> int:
    """Messages waiting in a Redis queue: kombu keeps one list per message priority
    (tasks.broker.config.PRIORITY_STEPS), so count them all."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return sum(client.llen(f"{prefix}{queue}{sep}") for sep in ["", *(f"\x06\x16{p}" for p in range(1, 10))])
    finally:
        client.close()


def _rows(db_url: str, job_id: str) -> list[Rollout]:
    with session_scope(db_url) as s:
        return s.scalars(sa.select(Rollout).where(Rollout.job_id == job_id)).all()


def test_dead_node_rollouts_restart_on_a_live_node(tmp_path, redis_pg):
    """n1's pools and reaper die for good with rollouts queued for run.n1 (issue: 4 stayed
    `run`, attempt 1, forever): they restart from INIT on n2 and the job finishes there."""
    t0 = time.monotonic()
    svc = start_service(
        tmp_path,
        nodes=("n1",),
        reaper="per_node",
        concurrency={"init": 4, "run": 1, "eval": 2},
        extra={"node_timeout": 3.0},
        **redis_pg,
    )
    db = svc.settings.db_url
    try:
        for stage in ("run", "eval"):  # n2 takes no INIT work until n1 is gone
            svc.start_worker(stage, "n2")
        job = svc.client.submit(
            "test-sleepy",
            [{"instance_id": f"i{k}"} for k in range(3)],
            n_samples=2,
            agent_config={"run_s": 3, "turns": 3},
        )

        def queued_on_n1():
            rows = _rows(db, job.job_id)
            queued = [r for r in rows if r.status == "run" and r.lease_owner is None]
            leased = [r for r in rows if r.status == "run" and r.lease_owner]
            return queued if len(queued) >= 3 and leased else None

        queued = {r.id for r in wait_for(queued_on_n1, 60, what="rollouts queued on run.n1")}
        for stage in ("init", "run", "eval"):
            svc.kill_worker(stage, "n1")
        svc.stop_reaper("n1")
        killed_at = time.monotonic()
        svc.start_worker("init", "n2")
        svc.start_reaper("n2")
        done = svc.wait_done(job.job_id, timeout=120)
        elapsed = time.monotonic() - killed_at
        assert done.counts == {"done": 6}, done
        results = svc.all_results(job.job_id)
        assert sorted(r.seq for r in results) == list(range(1, 7))  # each ended once
        by_id = {r.rollout_id: r for r in results}
        for r in results:
            assert r.outcome == "completed" and r.response_ids == [4, 5]
        for rid in queued:  # the stranded ones: a second attempt, all of it on n2
            r = by_id[rid]
            assert (r.node, r.attempt) == ("n2", 2), r
            where = r.extra["where"]
            assert where["init"]["node"] == where["run"]["node"] == where["eval"]["node"] == "n2"
            [earlier] = svc.client.rollout(rid).earlier_attempts
            # its pool's consumer row and its node's row went stale together: either says so
            assert "node n1 stopped beating" in earlier.error or "queue run.n1 has no live consumer" in earlier.error, (
                earlier
            )
        with session_scope(db) as s:
            samples = dict(
                s.execute(sa.select(Rollout.id, Rollout.sample_index).where(Rollout.job_id == job.job_id)).all()
            )
        assert all(r.reward == float(samples[r.rollout_id] % 2) for r in results)
        print(
            f"\nnode loss: {len(queued)} stranded rollouts finished on n2 "
            f"{elapsed:.1f} s after n1 died (test {time.monotonic() - t0:.1f} s so far)"
        )
    finally:
        svc.stop()


def test_a_consumer_that_dies_restarts_in_process(tmp_path, redis_prefix):
    """An error that ends Celery's consumer (issue 26: kombu's AttributeError on an ack
    during a Redis restart ended the EVAL pool for good) restarts the consumer in the same
    process: the pool never exits, keeps its consumer row, and takes the next job."""
    svc = start_service(
        tmp_path, broker_url=REDIS_URL, key_prefix=redis_prefix, reaper=False, handler_modules="tests.consumer_crash"
    )
    try:
        proc = svc.workers[("init", "node-a")]
        db = svc.settings.db_url
        for queue in ("init", "run.node-a", "eval.node-a"):
            wait_for(lambda q=queue: _consumers(db, q), 60, what=f"{queue}'s consumer row")
        crash = svc.client.submit("test-consumer-crash", [{"instance_id": "x"}])
        wait_for(
            lambda: "restarting it in this process" in svc.log_tail(200),
            timeout=60,
            what="the consumer's in-process restart",
        )
        job = svc.client.submit("test-sleepy", [{"instance_id": f"i{k}"} for k in range(3)])
        done = svc.wait_done(job.job_id, timeout=90)
        assert done.outcomes == {"completed": 3}, done
        svc.wait_done(crash.job_id, timeout=60)
        assert proc.poll() is None and "Unrecoverable error" not in svc.log_tail(400)
        assert _consumers(db, "init")
    finally:
        svc.stop()


def _consumers(db_url: str, queue: str) -> list[str]:
    with session_scope(db_url) as s:
        return s.scalars(sa.select(QueueConsumer.id).where(QueueConsumer.queue == queue)).all()


@pytest.mark.parametrize("how", ["ack", "reject", "requeue"])
def test_ack_on_a_connection_celery_closed_is_logged_not_raised(redis_prefix, caplog, how):
    """kombu raises AttributeError ('hostname') acking, rejecting or requeueing on a
    connection the consumer closed; the stage request logs it like any lost connection
    instead of crashing the consumer (each path forced on a real Redis message)."""
    from kombu import Connection, Queue

    from tasks.broker.acks import StageRequest
    from tasks.celery_app import make_celery
    from tasks.broker.config import stage_queue

    settings = Settings(home="/tmp", broker_url=REDIS_URL, broker_key_prefix=redis_prefix)
    app = make_celery(settings)
    app.send_task("raas.eval", args=["r1", 1], kwargs={"node": "n1"})
    conn = Connection(REDIS_URL, transport_options={"global_keyprefix": redis_prefix})
    channel = conn.channel()
    message = Queue(stage_queue("eval", "n1"))(channel).get(no_ack=False)
    assert message is not None
    channel._disconnect_pools()  # what losing the broker does to the consumer's connection
    conn._do_close_transport()
    plain = {
        "ack": lambda: message.channel.basic_ack(message.delivery_tag),
        "reject": lambda: message.channel.basic_reject(message.delivery_tag, False),
        "requeue": lambda: message.channel.basic_reject(message.delivery_tag, True),
    }
    with pytest.raises(AttributeError, match="hostname"):
        plain[how]()  # plain kombu: the crash
    request = StageRequest(
        message,
        on_ack=message.ack_log_error,
        on_reject=message.reject_log_error,
        app=app,
        task=app.tasks["raas.eval"],
        connection_errors=tuple(conn.connection_errors),
    )
    if how == "ack":
        request.acknowledge()  # logged, not raised
    else:
        request.reject(requeue=how == "requeue")
    assert request.acknowledged
    assert ("Couldn't ack" if how == "ack" else "Couldn't reject") in caplog.text
    channel.qos.restore_at_shutdown = False  # nothing to restore through a closed connection


# -- the reaper's rules, two reapers racing on real PostgreSQL -----------------------------


def _reaper_settings(tmp_path, pg_url, prefix, node, **extra):
    return Settings(
        home=tmp_path,
        database_url=pg_url,
        broker_url=REDIS_URL,
        broker_key_prefix=prefix,
        node=node,
        **{**FAST_RELIABILITY, "node_timeout": 3.0, **extra},
    )


def _seed(db_url: str, n: int) -> dict[str, list[str]]:
    """Rows for each rule: queued on a dead node, queued in an unconsumed queue of a live
    node, leased with a stale beat, and queued long ago on a live, consumed node."""
    old = utcnow() - timedelta(seconds=600)
    kinds: dict[str, list[str]] = {"dead": [], "deserted": [], "lost": [], "stale": []}
    with session_scope(db_url) as s:
        job = Job(agent="test-sleepy", n_instances=4 * n)
        s.add(job)
        s.flush()
        s.add_all(
            [
                Node(name="dead", beat_at=old),
                Node(name="live", beat_at=utcnow()),
                QueueConsumer(id="c-run", node="live", queue="run.live", pid=1),
                QueueConsumer(id="c-old", node="live", queue="eval.live", pid=2, beat_at=old),
                Node(name="other", beat_at=utcnow()),
                QueueConsumer(id="c-eval", node="other", queue="eval.other", pid=3),
            ]
        )
        for kind, status, node, lease in (
            ("dead", "run", "dead", None),
            ("deserted", "eval", "live", None),
            ("lost", "run", "live", "live/1/x"),
            ("stale", "run", "live", None),
        ):
            for k in range(n):
                r = Rollout(
                    job_id=job.id,
                    instance_id=f"{kind}{k}",
                    status=status,
                    node=node,
                    lease_owner=lease and f"{lease}{k}",
                    heartbeat_at=old,
                    queued_at=old,
                )
                s.add(r)
                s.flush()
                kinds[kind].append(r.id)
    return kinds


def test_two_reapers_racing_act_on_each_row_once(tmp_path, pg_url, redis_prefix, monkeypatch):
    """Both reapers read the same rows before either writes (forced with a barrier at the
    point between their read and their write): every row is retried or re-published once."""
    from tasks.writes import lifecycle
    from tasks.broker import queues
    from tasks.celery_app import make_celery
    from tasks.recovery.reaper import Reaper

    upgrade(pg_url)
    n = 8
    kinds = _seed(pg_url, n)
    reapers = [
        Reaper(s, make_celery(s))
        for s in (
            _reaper_settings(tmp_path, pg_url, redis_prefix, "live"),
            _reaper_settings(tmp_path, pg_url, redis_prefix, "other"),
        )
    ]
    barrier = threading.Barrier(2, timeout=10)
    waited = threading.local()

    def rendezvous(fn):
        def wrapped(*args, **kwargs):
            if not getattr(waited, fn.__name__, False):
                setattr(waited, fn.__name__, True)
                barrier.wait()
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(lifecycle, "retry", rendezvous(lifecycle.retry))
    monkeypatch.setattr(queues, "queue_depths", rendezvous(queues.queue_depths))
    counts: list[dict[str, int]] = []

    def one_pass(reaper):
        counts.append(
            {
                "abandoned": reaper.reroute_abandoned(),
                "lost": reaper.reclaim_lost(),
                "requeued": reaper.republish_stale(),
            }
        )

    threads = [threading.Thread(target=one_pass, args=(r,)) for r in reapers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with session_scope(pg_url) as s:
        attempts = dict(s.execute(sa.select(Rollout.id, Rollout.attempt)).all())
        errors = dict(s.execute(sa.select(Rollout.id, Rollout.error)).all())
        moves = dict(s.execute(sa.select(Rollout.id, Rollout.resumes)).all())
        where = dict(s.execute(sa.select(Rollout.id, Rollout.node)).all())
    restarted = kinds["dead"] + kinds["lost"]
    assert all(attempts[i] == 2 for i in restarted), attempts  # once, not twice
    assert all(attempts[i] == 1 for i in kinds["stale"] + kinds["deserted"])
    assert all("node dead stopped beating" in errors[i] for i in kinds["dead"])
    for i in kinds["deserted"]:  # EVAL-ready: moved to the live EVAL queue once, not re-run
        [move] = moves[i]
        assert where[i] == "other" and "eval.live has no live consumer" in move["error"], move
    assert queue_depth(redis_prefix, "init") == 2 * n  # one INIT message per restart
    assert queue_depth(redis_prefix, "eval.other") == n  # one message per move
    assert queue_depth(redis_prefix, "run.live") == n  # one re-publish per stale row
    assert sum(c["abandoned"] + c["lost"] for c in counts) == 3 * n


def test_embedded_single_node_is_never_judged_dead_by_itself(tmp_path):
    """One node, its own reaper: a stale row of its own (e.g. after a long stop) is beaten
    back by the start-up pass before any rule runs, and nothing is re-routed."""
    from tasks.recovery.reaper import Reaper

    settings = Settings(home=tmp_path, node="solo", node_timeout=1.0)
    upgrade(settings.db_url)
    old = utcnow() - timedelta(seconds=600)
    with session_scope(settings.db_url) as s:
        job = Job(agent="test-sleepy", n_instances=1)
        s.add(job)
        s.flush()
        s.add_all(
            [
                Node(name="solo", beat_at=old),
                QueueConsumer(id="c1", node="solo", queue="run.solo", pid=1),
                Rollout(job_id=job.id, instance_id="a", status="run", node="solo", queued_at=old),
            ]
        )
    reaper = Reaper(settings, celery=None)
    reaper.start_up()
    assert reaper.reroute_abandoned() == 0
    with session_scope(settings.db_url) as s:
        assert s.scalar(sa.select(Rollout.attempt)) == 1
        assert s.get(Node, "solo").started_at is not None


def test_returning_node_stops_its_stale_sandboxes_before_taking_work(tmp_path):
    """A node back after being judged dead holds a live sandbox of an attempt that restarted
    elsewhere: its pool stops it before it registers as the queue's consumer."""
    from sandbox import list_sandboxes
    from tasks.sandboxing import sandboxes

    # The pool reads its settings from the harness's RAAS_* variables only: name the sandbox
    # folder for both sides (a session fixture elsewhere may have set RAAS_SANDBOX_DIR here).
    sandbox_dir = tempfile.mkdtemp(prefix="raas-sbx-", dir="/tmp")  # short: socket paths
    settings = Settings(home=tmp_path, node="n1", sandbox_dir=sandbox_dir)
    upgrade(settings.db_url)
    with session_scope(settings.db_url) as s:
        job = Job(agent="test-sleepy", n_instances=1)
        s.add(job)
        s.flush()
        rollout = Rollout(job_id=job.id, instance_id="a", status="pending", attempt=2)
        s.add(rollout)
        s.flush()
        rid = rollout.id
    _, handle = sandboxes.start(settings, {}, rid, 1, "bwrap")  # attempt 1's, on n1
    labels = lambda: {h.get("label") for h in list_sandboxes(settings.sandbox_dir)}  # noqa: E731
    assert f"{rid}:1" in labels()
    svc = start_service(tmp_path, nodes=("n1",), stages=("eval",), reaper=False, extra={"sandbox_dir": sandbox_dir})
    try:
        wait_for(lambda: _consumers(settings.db_url, "eval.n1"), 60, what="eval.n1's consumer")
        assert f"{rid}:1" not in labels()
        assert not (tmp_path / "workspaces" / f"{rid}-1").exists()
    finally:
        svc.stop()
        sandboxes.release(handle)
        shutil.rmtree(sandbox_dir, ignore_errors=True)


def test_workers_reconnect_after_a_broker_outage(tmp_path, private_redis):
    """Redis goes away for a while and comes back empty: every pool reconnects by itself
    (same processes, none exited) and a job submitted afterwards completes."""
    svc = start_service(tmp_path, broker_url=private_redis.url)
    db = svc.settings.db_url
    try:
        for queue in ("init", "run.node-a", "eval.node-a"):
            wait_for(lambda q=queue: _consumers(db, q), 60, what=f"{queue}'s consumer")
        pids = {key: proc.pid for key, proc in svc.workers.items()}
        private_redis.restart("immediate", downtime=4.0)
        job = svc.client.submit("test-sleepy", [{"instance_id": f"i{k}"} for k in range(3)])
        done = svc.wait_done(job.job_id, timeout=120)
        assert done.outcomes == {"completed": 3}
        assert {key: proc.pid for key, proc in svc.workers.items()} == pids
        assert all(proc.poll() is None for proc in svc.workers.values())
    finally:
        svc.stop()


def test_a_reaper_judges_nodes_only_after_watching_them_for_node_timeout(tmp_path):
    """After a database outage (or its own start) every node's rows look stale: the reaper
    re-routes nothing until it has watched them for `node_timeout` without a gap."""
    from tasks.celery_app import make_celery
    from tasks.recovery.reaper import Reaper

    settings = Settings(home=tmp_path, node="n2", node_timeout=1.0, reaper_interval=0.5)
    upgrade(settings.db_url)
    old = utcnow() - timedelta(seconds=600)
    with session_scope(settings.db_url) as s:
        job = Job(agent="test-sleepy", n_instances=2)
        s.add(job)
        s.flush()
        s.add_all(
            [
                Node(name="n1", beat_at=old),
                *[
                    Rollout(job_id=job.id, instance_id=f"i{k}", status="run", node="n1", queued_at=old)
                    for k in range(2)
                ],
            ]
        )
    reaper = Reaper(settings, make_celery(settings))

    def passes(seconds: float) -> int:
        total, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            total += reaper.run_once()["abandoned"]
            time.sleep(0.05)
        return total

    assert passes(0.6) == 0  # just started: n1 may only look dead
    reaper._last_beat -= 10  # a gap, as when the database was away
    assert passes(0.6) == 0  # 1.2 s since the start, 0.6 s since the gap
    assert passes(1.5) == 2
    with session_scope(settings.db_url) as s:
        assert set(s.scalars(sa.select(Rollout.attempt))) == {2}


def test_eval_ready_rollouts_of_a_dead_node_are_graded_elsewhere_not_rerun(tmp_path, pg_url, redis_prefix):
    """Issue 26.4/27: a dead node held rollouts waiting for EVAL and one in EVAL (leased by
    its dead worker), with artifacts stored. The live node's reaper moves them to its EVAL
    queue in the same attempt (no restart from INIT); a rollout that never finished RUN
    restarts from INIT. Without a live EVAL anywhere, the EVAL-ready ones stay put."""
    from tasks.celery_app import make_celery
    from tasks.recovery.reaper import Reaper

    upgrade(pg_url)
    old = utcnow() - timedelta(seconds=600)
    with session_scope(pg_url) as s:
        job = Job(agent="test-sleepy", n_instances=3)
        s.add(job)
        s.flush()
        s.add_all([Node(name="dead", beat_at=old), Node(name="live", beat_at=utcnow())])
        rows = {
            "queued": Rollout(
                job_id=job.id, instance_id="q", status="eval", node="dead", queued_at=old, artifact={"answer": "1"}
            ),
            "leased": Rollout(
                job_id=job.id,
                instance_id="l",
                status="eval",
                node="dead",
                lease_owner="dead/1/x",
                heartbeat_at=old,
                queued_at=old,
                artifact={"answer": "2"},
            ),
            "running": Rollout(
                job_id=job.id,
                instance_id="r",
                status="run",
                node="dead",
                lease_owner="dead/1/y",
                heartbeat_at=old,
                queued_at=old,
            ),
        }
        s.add_all(rows.values())
        s.flush()
        ids = {k: r.id for k, r in rows.items()}
    settings = _reaper_settings(tmp_path, pg_url, redis_prefix, "live")
    reaper = Reaper(settings, make_celery(settings))
    reaper.reroute_abandoned()  # no live EVAL consumer anywhere yet

    def state() -> dict[str, tuple]:
        with session_scope(pg_url) as s:
            got = {r.id: (r.status, r.node, r.attempt) for r in s.scalars(sa.select(Rollout))}
        return {k: got[i] for k, i in ids.items()}

    assert state()["queued"] == ("eval", "dead", 1) and state()["running"][2] == 2
    with session_scope(pg_url) as s:
        s.add(QueueConsumer(id="c-eval", node="live", queue="eval.live", pid=3))
    assert reaper.reroute_abandoned() == 2
    assert state() | {"running": None} == {
        "queued": ("eval", "live", 1),
        "leased": ("eval", "live", 1),
        "running": None,
    }
    assert queue_depth(redis_prefix, "eval.live") == 2  # one EVAL message each
    assert queue_depth(redis_prefix, "init") == 1  # the unfinished RUN only
