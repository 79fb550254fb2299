"""Database connections per process are a small pool, independent of the slots.

A node with 64 RUN slots runs against a PostgreSQL that accepts only 40 connections: every
rollout completes with its reward while the database never sees more connections than the
processes' pools allow, and the 64 slots really ran at once (a slot holds a connection only
for a transaction, never across a hook).
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from core.db import configure_pool, get_engine
from core.settings import Settings
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

POOL = 4
RUN_SLOTS = 64
TURNS = 4
RUN_S = 1.0


class ConnectionSampler:
    """Peak connections to one database, sampled every 20 ms over a connection to another
    database (so the sampler never counts itself)."""

    def __init__(self, admin_url: str, database: str) -> None:
        self.engine = sa.create_engine(admin_url, poolclass=sa.pool.NullPool)
        self.database = database
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d")
        with self.engine.connect() as conn:
            while not self._stop.wait(0.02):
                self.peak = max(self.peak, conn.execute(query, {"d": self.database}).scalar())
                conn.commit()

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.engine.dispose()


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals that overlap at one instant."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def test_64_run_slots_finish_everything_within_a_40_connection_postgres(tmp_path, make_private_postgres, redis_prefix):
    server = make_private_postgres(max_connections=40)
    db_url = server.create_database("raas")
    with ConnectionSampler(server.url(), "raas") as sampler:
        svc = start_service(
            tmp_path,
            db_url=db_url,
            broker_url=REDIS_URL,
            key_prefix=redis_prefix,
            concurrency={"init": 8, "run": RUN_SLOTS, "eval": 8},
            # a loaded machine must not make a slow beat cost a retry
            extra={"db_pool_size": POOL, "lease_timeout": 30.0},
        )
        try:
            job = svc.client.submit(
                "test-sleepy",
                [{"instance_id": f"i{k}"} for k in range(RUN_SLOTS // 2)],
                n_samples=2,
                agent_config={"turns": TURNS, "run_s": RUN_S},
            )
            view = svc.wait_done(job.job_id, timeout=90)
            results = svc.all_results(job.job_id)
            logs = svc.log_tail(lines=100_000)
            workers = sum(len(procs) for procs in svc.processes.values())  # RUN's 64 slots are two
        finally:
            svc.stop()
    assert view.counts == {"done": RUN_SLOTS}, view
    assert sorted(r.reward for r in results) == [0.0] * 32 + [1.0] * 32
    assert all(r.reward == float(r.sample_index % 2) for r in results)
    assert all(r.response_ids == [4, 5] and r.loss_mask == [1, 1] for r in results)
    assert "too many clients" not in logs and "QueuePool limit" not in logs
    # bound: the worker processes (INIT, two RUN, EVAL) + this process (gateway and reaper)
    # at POOL each, plus the gateway's single-threaded outbox publisher process (one connection)
    assert workers == 4
    assert 0 < sampler.peak <= (workers + 1) * POOL + 1 < 40, sampler.peak
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT t.rollout_id, min(t.created_at), max(t.created_at), count(*) FROM turns t "
                "JOIN rollouts r ON r.id = t.rollout_id AND r.attempt = t.attempt "
                "GROUP BY t.rollout_id"
            )
        ).all()
    engine.dispose()
    assert len(rows) == RUN_SLOTS and {n for *_, n in rows} == {TURNS}
    # the slots really ran at once: a connection held across the handler's sleeps would
    # have let at most POOL rollouts through RUN together
    spans = [(first.timestamp() - RUN_S / TURNS, last.timestamp()) for _, first, last, _ in rows]
    assert most_at_once(spans) >= RUN_SLOTS * 3 // 4


def test_pool_settings_size_server_engines_and_leave_sqlite_alone(tmp_path, pg_url):
    configure_pool(Settings(db_pool_size=3, db_pool_overflow=1, db_pool_timeout=7.5))
    try:
        pool = get_engine(pg_url).pool
        assert (pool.size(), pool._max_overflow, pool._timeout) == (3, 1, 7.5)
        # PgBouncer in transaction mode: never a server-side prepared statement (psycopg
        # prepares a query on its 5th run by default)
        with get_engine(pg_url).connect() as conn:
            for _ in range(10):
                conn.execute(sa.text("SELECT 1 + :x"), {"x": 1})
            assert conn.execute(sa.text("SELECT count(*) FROM pg_prepared_statements")).scalar() == 0
        sqlite = get_engine(f"sqlite:///{tmp_path / 'x.db'}")
        assert sqlite.pool.size() != 3
    finally:
        configure_pool(Settings())


def test_a_pool_that_stays_busy_fails_the_call_as_retryable_infrastructure(pg_url):
    from core.db import session_scope
    from tasks.stage_records import RETRYABLE

    configure_pool(Settings(db_pool_size=1, db_pool_timeout=0.2))
    try:
        with session_scope(pg_url) as held:  # the only connection, taken
            held.execute(sa.text("SELECT 1"))
            with pytest.raises(RETRYABLE) as caught, session_scope(pg_url) as s:
                s.execute(sa.text("SELECT 1"))
        assert "QueuePool limit" in str(caught.value)  # waited, then gave up (not a refusal)
    finally:
        configure_pool(Settings())
