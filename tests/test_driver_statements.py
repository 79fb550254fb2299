"""The hot path's statements on the driver's cursor (`core.driver_statements`): the same rows,
counts and errors as SQLAlchemy's own path, on SQLite and PostgreSQL, and JSON columns written
by `core.json_columns` (non-finite floats as null, big integers kept)."""

from __future__ import annotations

import math

import pytest
import sqlalchemy as sa
from sqlalchemy import bindparam, select, update

from core import driver_statements
from core.db import get_engine, session_scope, use_pre_ping
from core.models import Job, Rollout, utcnow
from migrations.runner import upgrade
from tasks.writes import lifecycle, statements

ROLLOUTS = Rollout.__table__
# Built once, as the callers' statements are (the driver path keeps their compiled forms).
SET_STATE = (
    update(ROLLOUTS)
    .where(ROLLOUTS.c.id == bindparam("k_rid"))
    .values(state=statements.param("state"), metrics=statements.param("metrics"))
    .returning(ROLLOUTS.c.state, ROLLOUTS.c.metrics, ROLLOUTS.c.heartbeat_at, ROLLOUTS.c.cancel_requested)
)
TOUCH = update(ROLLOUTS).where(ROLLOUTS.c.job_id == bindparam("k_job")).values(attempt=ROLLOUTS.c.attempt + 1)
READ_BACK = select(ROLLOUTS).where(ROLLOUTS.c.id == bindparam("k_rid"))
INSERT_ID = ROLLOUTS.insert().values(id=bindparam("k_rid"), job_id=bindparam("k_job"), instance_id="x")


def _rollouts(db_url: str, n: int) -> tuple[str, list[str]]:
    upgrade(db_url)
    with session_scope(db_url) as s:
        job = Job(owner="default", agent="test-trivial", config={}, n_instances=n)
        s.add(job)
        s.flush()
        ids = [f"r{k}" for k in range(n)]
        s.add_all(Rollout(id=rid, job_id=job.id, instance_id=rid, status="run", heartbeat_at=utcnow()) for rid in ids)
        return job.id, ids


def test_rows_and_counts_are_sqlalchemys(any_db_url) -> None:
    job, (rid, _) = _rollouts(any_db_url, 2)
    engine = get_engine(any_db_url)
    state = {"seen": [1, 2], "big": 2**70, "nan": math.nan, 3: "int key"}
    with engine.begin() as conn:
        row = driver_statements.execute(conn, SET_STATE, {"k_rid": rid, "v_state": state, "v_metrics": {}}).first()
    # JSON has no NaN: null on both databases; an integer past 64 bits and an int key as
    # json.dumps writes them.
    assert row.state == {"seen": [1, 2], "big": 2**70, "nan": None, "3": "int key"}
    assert row._mapping["metrics"] == {} and row.cancel_requested is False
    assert row.heartbeat_at is not None and row.heartbeat_at.utcoffset() is not None or engine.dialect.name == "sqlite"
    with engine.begin() as conn:
        assert driver_statements.execute(conn, TOUCH, {"k_job": job}).rowcount == 2
    with engine.begin() as conn:
        ours = driver_statements.execute(conn, READ_BACK, {"k_rid": rid}).first()
        theirs = conn.execute(READ_BACK, {"k_rid": rid}).one()
    assert dict(ours._mapping) == dict(theirs._mapping)
    assert ours.attempt == 2


def test_run_alone_commits_and_leaves_the_pool_transactional(any_db_url) -> None:
    _, (rid,) = _rollouts(any_db_url, 1)
    engine = get_engine(any_db_url)
    driver_statements.run_alone(engine, SET_STATE, {"k_rid": rid, "v_state": {"k": 1}, "v_metrics": {"m": 2}})
    with session_scope(any_db_url) as s:
        assert s.get(Rollout, rid).state == {"k": 1}
    # The pooled connection went back out of autocommit: a failed transaction still rolls back.
    with pytest.raises(RuntimeError), engine.begin() as conn:
        driver_statements.execute(conn, SET_STATE, {"k_rid": rid, "v_state": {"k": 2}, "v_metrics": {}})
        raise RuntimeError("abort")
    with session_scope(any_db_url) as s:
        assert s.get(Rollout, rid).state == {"k": 1}


def test_errors_are_sqlalchemys(any_db_url) -> None:
    job, (rid,) = _rollouts(any_db_url, 1)
    with pytest.raises(sa.exc.IntegrityError):
        driver_statements.run_alone(get_engine(any_db_url), INSERT_ID, {"k_rid": rid, "k_job": job})


def test_a_dropped_connection_is_an_operational_error_and_the_pool_recovers(pg_url) -> None:
    """What `tasks.writes.db_retry` retries: the database restarted under a pooled connection (a
    stage worker's pool does not ping on checkout, `core.db.use_pre_ping`)."""
    _, (rid,) = _rollouts(pg_url, 1)
    use_pre_ping(False)
    try:
        engine = get_engine(pg_url)
    finally:
        use_pre_ping(True)
    params = {"k_rid": rid, "v_state": {}, "v_metrics": {}}
    driver_statements.run_alone(engine, SET_STATE, params)  # a pooled connection exists now
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    admin.dispose()
    with pytest.raises(sa.exc.OperationalError) as caught:
        driver_statements.run_alone(engine, SET_STATE, params)
    assert caught.value.connection_invalidated
    assert driver_statements.run_alone(engine, SET_STATE, params).first().state == {}
    with engine.begin() as conn:  # SQLAlchemy's own path is unharmed too
        assert conn.execute(READ_BACK, {"k_rid": rid}).one().id == rid


def test_the_claim_returns_the_row_as_the_orm_wrote_it(any_db_url) -> None:
    _, (rid,) = _rollouts(any_db_url, 1)
    with session_scope(any_db_url) as s:
        row = s.get(Rollout, rid)
        row.status, row.node, row.instance = "run", "n1", {"question": "q", "n": [1, 2]}
    claimed, job = lifecycle.claim(any_db_url, rid, 1, "run", "lease-1", "n1")
    assert (claimed.id, claimed.lease_owner, claimed.instance) == (rid, "lease-1", {"question": "q", "n": [1, 2]})
    assert claimed.paused_seconds == 0.0 and job.agent == "test-trivial"
    claimed.sandbox = {"id": "s"}  # a stage notes its sandbox on the record
    assert lifecycle.claim(any_db_url, rid, 1, "run", "lease-2", "n1") is None


def test_a_terminal_write_with_a_fixed_in_list(any_db_url) -> None:
    """`terminal.finish` fences on `status IN (<the statuses it may end>)`: expanded once."""
    from core.models import Status
    from tasks.writes import terminal

    _, (rid,) = _rollouts(any_db_url, 1)
    with session_scope(any_db_url) as s:
        row = s.get(Rollout, rid)
        row.status, row.lease_owner = "eval", "L"
    assert terminal.finish(any_db_url, rid, Status.DONE, "completed", lease="L", reward=1.0)
    assert not terminal.finish(any_db_url, rid, Status.DONE, "completed", lease="L", reward=0.5)
    with session_scope(any_db_url) as s:
        row = s.get(Rollout, rid)
        assert (row.status, row.reward, row.result_seq, row.lease_owner) == ("done", 1.0, 1, None)


def test_an_in_list_given_at_execution_is_refused(pg_url) -> None:
    upgrade(pg_url)
    many = select(ROLLOUTS.c.id).where(ROLLOUTS.c.id.in_(bindparam("k_ids", expanding=True)))
    with pytest.raises(TypeError, match="IN list"):
        driver_statements.run_alone(get_engine(pg_url), many, {"k_ids": ["a"]})
