"""Issue 40: every statement a stage runs rides out a refused database connection.

The database sits behind a loopback proxy (`bench.support.tcp_proxy`) that resets every open
connection and refuses new ones for `OUTAGE` seconds, as a PostgreSQL restart does to a
worker. Each statement is then called as the stages call it (through `tasks.writes.db_retry`, the
budget a worker sets) and must succeed once the database answers again, with its effect
written exactly once. Both paths are covered: the hot path's driver statements
(`core.driver_statements`: the pool checks out a raw connection, whose refusal raised the
driver's own `psycopg.OperationalError` unwrapped) and SQLAlchemy's own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from core import driver_statements
from core.db import get_engine, session_scope, use_pre_ping
from core.models import Job, LLMServer, Rollout, Status, Turn, utcnow
from migrations.runner import upgrade
from tasks.writes import db_retry, lifecycle, terminal
from tasks.llm import llm_pool_sql as sql
from tasks.llm.llm_pool import RegisteredPool
from bench.support.tcp_proxy import LoopbackProxy

OUTAGE = 0.6  # seconds the proxy refuses: several retries at db_retry's first waits
OWNER, URL, LEASE = "default", "http://llm.invalid:1", "node/1/lease"


@dataclass
class Outage:
    """The database behind a proxy, one leased rollout in RUN and one registered server."""

    db: str
    proxy: LoopbackProxy
    job: Job
    struck_at: float | None = None

    def refused_now(self) -> None:
        """Reset every open connection and refuse new ones for OUTAGE seconds; the refusal is
        checked, so a test whose call succeeds could not have dodged it."""
        self.struck_at = time.monotonic()
        self.proxy.refuse_for(OUTAGE)
        with pytest.raises(psycopg.OperationalError, match="refused"):
            psycopg.connect(host="127.0.0.1", port=self.proxy.port, user="postgres", dbname="x", connect_timeout=2)

    def pool(self) -> Any:
        """The RUN's LLM pool as a stage builds it (`db_retry.Retrying`)."""
        return db_retry.Retrying(RegisteredPool(self.db, "vllm", "r1", LEASE, OWNER))

    def row(self) -> Rollout:
        with session_scope(self.db) as s:
            row = s.get(Rollout, "r1")
            s.expunge(row)
            return row


@pytest.fixture
def outage(pg_url, caplog) -> Iterator[Outage]:
    proxy = LoopbackProxy(sa.engine.make_url(pg_url).port or 5432)
    db = sa.engine.make_url(pg_url).set(port=proxy.port).render_as_string(hide_password=False)
    upgrade(db)
    with session_scope(db) as s:
        job = Job(owner=OWNER, agent="test-trivial", config={}, n_instances=1)
        s.add(job)
        s.flush()
        s.add(Rollout(id="r1", job_id=job.id, instance_id="i", status="run", lease_owner=LEASE, heartbeat_at=utcnow()))
        s.add(LLMServer(owner=OWNER, url=URL, model="m", healthy=True, in_flight=0))
        s.flush()
        s.expunge(job)
    use_pre_ping(False)  # a stage worker's pool: no ping on checkout, a dead connection fails
    try:
        get_engine(db)
    finally:
        use_pre_ping(True)
    with get_engine(db).connect() as conn:  # a pooled connection the outage will kill
        conn.execute(sa.text("SELECT 1"))
    db_retry.configure(15)
    caplog.set_level(logging.WARNING, logger="tasks.writes.db_retry")
    try:
        yield Outage(db, proxy, job)
    finally:
        db_retry.configure(0)
        get_engine(db).dispose()
        proxy.close()


def _retried(caplog) -> None:
    assert any("database unreachable" in r.getMessage() for r in caplog.records), "no retry was needed"


def _in_flight(o: Outage) -> int:
    with session_scope(o.db) as s:
        return s.scalar(sa.select(LLMServer.in_flight).where(LLMServer.url == URL))


# Each case: its set-up, the outage, the call as a stage makes it, its effect checked after.
def _claim(o: Outage) -> None:
    with session_scope(o.db) as s:
        s.execute(sa.update(Rollout).values(status="run", lease_owner=None, node="n1"))
    o.refused_now()
    claimed = lifecycle.claim(o.db, "r1", 1, "run", "L2", "n1")
    assert claimed is not None and claimed[0].lease_owner == "L2" and o.row().lease_owner == "L2"


def _hand_off(o: Outage) -> None:
    o.refused_now()
    handed, _ = lifecycle.hand_off(o.db, "r1", LEASE, "eval", run_seconds=1.0)
    assert handed and o.row().status == "eval" and o.row().lease_owner is None


def _turn(o: Outage) -> None:
    o.refused_now()
    lifecycle.record_turn(o.db, "r1", 1, lease=LEASE, index=0, generated_ids=[7, 8])
    with session_scope(o.db) as s:
        assert s.scalars(sa.select(Turn.generated_ids)).all() == [[7, 8]]


def _finish(o: Outage) -> None:
    with session_scope(o.db) as s:  # EVAL's terminal write
        s.execute(sa.update(Rollout).values(status="eval"))
    o.refused_now()
    assert terminal.finish(o.db, "r1", Status.DONE, "completed", lease=LEASE, group=o.job, reward=1.0)
    row = o.row()
    assert (row.status, row.reward, row.lease_owner) == ("done", 1.0, None)


def _save(o: Outage) -> None:  # SQLAlchemy's own path
    o.refused_now()
    assert lifecycle.save(o.db, "r1", LEASE, metrics={"k": 1}) and o.row().metrics == {"k": 1}


def _acquire(o: Outage) -> None:
    o.refused_now()
    assert o.pool().acquire().url == URL and _in_flight(o) == 1


def _take(o: Outage) -> None:
    o.refused_now()
    assert o.pool().take(URL).url == URL and _in_flight(o) == 1


def _release(o: Outage) -> None:
    with session_scope(o.db) as s:
        s.execute(sa.update(LLMServer).values(in_flight=1))
    o.refused_now()
    o.pool().release(URL)
    assert _in_flight(o) == 0


def _lookup(o: Outage) -> None:
    o.refused_now()
    assert o.pool().lookup(URL).model == "m"


def _stick(o: Outage) -> None:
    o.refused_now()
    o.pool().stick(URL)
    assert o.row().llm_server == URL


def _sticky_url(o: Outage) -> None:
    with session_scope(o.db) as s:
        s.execute(sa.update(Rollout).values(llm_server=URL))
    o.refused_now()
    assert o.pool().sticky_url() == URL


def _begin_generation(o: Outage) -> None:
    o.refused_now()
    assert o.pool().begin_generation(URL).url == URL and o.row().generating_on == URL


def _note_paused(o: Outage) -> None:
    o.refused_now()
    o.pool().note_paused(2.5)
    assert o.row().paused_seconds == 2.5


def _run_alone(o: Outage) -> None:  # the bare driver call, retried as the pool's are
    o.refused_now()
    row = db_retry.call(driver_statements.run_alone, get_engine(o.db), sql.STICKY_URL, {"p_rollout": "r1"})
    assert row.first() == (None,)


CASES: dict[str, Callable[[Outage], None]] = {
    f.__name__.lstrip("_"): f
    for f in (
        _claim,
        _hand_off,
        _turn,
        _finish,
        _save,
        _acquire,
        _take,
        _release,
        _lookup,
        _stick,
        _sticky_url,
        _begin_generation,
        _note_paused,
        _run_alone,
    )
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_refused_connection_is_retried_and_the_statement_lands_once(outage, caplog, name) -> None:
    started = time.monotonic()
    CASES[name](outage)
    assert outage.struck_at is not None and time.monotonic() - outage.struck_at >= OUTAGE * 0.5
    assert time.monotonic() - started < 10  # ...and went on once it answered
    _retried(caplog)


def test_a_refused_checkout_is_sqlalchemys_operational_error(outage) -> None:
    """Without a budget the driver path raises at once, as SQLAlchemy's error that the
    stages treat as an outage (never the driver's own, which ended rollouts as infra_error)."""
    db_retry.configure(0)
    outage.refused_now()
    get_engine(outage.db).dispose()  # no pooled connection: the checkout itself is refused
    with pytest.raises(sa.exc.OperationalError) as caught:
        driver_statements.run_alone(get_engine(outage.db), sql.STICKY_URL, {"p_rollout": "r1"})
    assert isinstance(caught.value.orig, psycopg.OperationalError)
    assert db_retry.is_disconnect(caught.value)


def test_a_driver_error_that_escapes_still_counts_as_an_outage() -> None:
    """Defence in depth: the retry and the stages' RETRYABLE know the drivers' own class."""
    from tasks.stage_records import RETRYABLE

    exc = psycopg.OperationalError("connection failed: Connection refused")
    assert db_retry.is_disconnect(exc) and isinstance(exc, RETRYABLE)
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise exc
        return "ok"

    db_retry.configure(5)
    try:
        assert db_retry.call(flaky) == "ok" and len(calls) == 3
    finally:
        db_retry.configure(0)
