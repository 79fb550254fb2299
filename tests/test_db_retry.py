"""Stage writes retry a lost database connection within their budget, and a retried write
whose first commit landed is harmless (`tasks.writes.db_retry`, `tasks.writes.lifecycle`)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError

from core.db import session_scope
from core.errors import LeaseLost
from core.models import Job, Rollout, Turn
from migrations.runner import upgrade
from tasks.writes import db_retry, lifecycle


def _lost_connection() -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception("server closed the connection"))


@pytest.fixture
def budget():
    db_retry.configure(2.0)
    yield
    db_retry.configure(0)


def test_connection_errors_are_retried_until_the_database_answers(budget) -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _lost_connection()
        return "ok"

    assert db_retry.call(flaky) == "ok" and len(calls) == 3


def test_other_errors_and_an_empty_budget_raise_at_once(budget) -> None:
    calls = []

    def bad_query() -> None:
        calls.append(1)
        raise IntegrityError("INSERT", {}, Exception("duplicate key"))

    with pytest.raises(IntegrityError):
        db_retry.call(bad_query)
    db_retry.configure(0)
    with pytest.raises(OperationalError):
        db_retry.call(lambda: (calls.append(1), (_ for _ in ()).throw(_lost_connection())))
    assert len(calls) == 2


@pytest.fixture
def leased(sqlite_url) -> tuple[str, str]:
    upgrade(sqlite_url)
    with session_scope(sqlite_url) as s:
        job = Job(owner="o", agent="test-trivial", config={}, n_instances=1)
        s.add(job)
        s.flush()
        s.add(Rollout(id="r1", job_id=job.id, instance_id="i", status="run", lease_owner="L1"))
    return sqlite_url, "L1"


def test_a_retried_turn_or_hand_off_is_not_done_twice(leased) -> None:
    db, lease = leased
    for _ in range(2):  # the second call is what a retry after a lost reply does
        lifecycle.record_turn(db, "r1", 1, lease=lease, index=0, generated_ids=[1])
    with session_scope(db) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Turn)) == 1
    assert lifecycle.advance(db, "r1", lease, "eval")
    assert lifecycle.advance(db, "r1", lease, "eval")  # finds its own hand-off done


def test_a_turn_of_a_lease_that_moved_on_is_refused(leased) -> None:
    db, _ = leased
    with pytest.raises(LeaseLost):
        lifecycle.record_turn(db, "r1", 1, lease="L0", index=0, generated_ids=[1])
    with session_scope(db) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Turn)) == 0


def test_the_reaper_judges_no_lease_for_a_lease_time_after_a_database_outage(leased) -> None:
    import time
    from datetime import timedelta

    from core.models import utcnow
    from core.settings import Settings
    from tasks.recovery.reaper import Reaper

    db, _ = leased
    with session_scope(db) as s:
        s.get(Rollout, "r1").heartbeat_at = utcnow() - timedelta(hours=1)
    reaper = Reaper(Settings(database_url=db, lease_timeout=5, max_attempts=1), celery=None)
    reaper._db_lost = True
    reaper._database_is_back()  # what the first pass after the outage does
    assert reaper.reclaim_lost() == 0  # the beats of the outage could not be written
    reaper._db_back_at = time.monotonic() - 6
    assert reaper.reclaim_lost() == 1
    with session_scope(db) as s:
        assert s.get(Rollout, "r1").status == "failed"
