"""The turn log's write path (`tasks.writes.turn_log`): the lease fence inside the insert, on SQLite
and PostgreSQL, and group commit across the threads of one process (order, durability, one
refused write not spoiling its batch)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import sqlalchemy as sa

from core.db import get_engine, session_scope
from core.errors import LeaseLost
from core.models import Job, Rollout, Turn, utcnow
from migrations.runner import upgrade
from tasks.writes import lifecycle, turn_log


def _rollouts(db_url: str, n: int, lease: str = "L1") -> list[str]:
    upgrade(db_url)
    with session_scope(db_url) as s:
        job = Job(owner="default", agent="test-trivial", config={}, n_instances=n)
        s.add(job)
        s.flush()
        ids = [f"r{k:03d}" for k in range(n)]
        for rid in ids:
            s.add(
                Rollout(
                    id=rid,
                    job_id=job.id,
                    instance_id=rid,
                    status="run",
                    lease_owner=f"{lease}-{rid}",
                    heartbeat_at=utcnow(),
                )
            )
    return ids


def _turns(db_url: str, rollout_id: str | None = None) -> list[tuple[str, int, str | None]]:
    query = sa.select(Turn.rollout_id, Turn.index, Turn.text).order_by(Turn.id)
    if rollout_id is not None:
        query = query.where(Turn.rollout_id == rollout_id)
    with session_scope(db_url) as s:
        return [tuple(r) for r in s.execute(query)]


def test_the_fenced_insert_is_one_statement_and_refuses_a_stale_lease(any_db_url) -> None:
    [rid] = _rollouts(any_db_url, 1)
    engine = get_engine(any_db_url)
    statements: list[str] = []
    sa.event.listen(
        engine, "before_cursor_execute", lambda *a: statements.append(a[2])
    )  # (conn, cursor, statement, ...)
    with engine.begin() as conn:
        turn_log.write_turn(conn, rid, 1, f"L1-{rid}", {"index": 0, "text": "ok", "generated_ids": [1, 2]})
    inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT")]
    assert len(inserts) == 1 and "lease_owner" in inserts[0]
    assert (
        len([s for s in statements if not s.lstrip().upper().startswith(("BEGIN", "COMMIT"))]) == 1
    )  # no UPDATE of the rollout, no read-back
    if engine.dialect.name == "postgresql":
        assert "FOR SHARE" in inserts[0]
    with pytest.raises(LeaseLost):
        with engine.begin() as conn:
            turn_log.write_turn(conn, rid, 1, "someone-else", {"index": 1, "text": "stale"})
    assert _turns(any_db_url) == [(rid, 0, "ok")]
    # A retried insert whose first commit landed is not an error and adds nothing.
    with engine.begin() as conn:
        turn_log.write_turn(conn, rid, 1, f"L1-{rid}", {"index": 0, "text": "ok"})
    assert _turns(any_db_url) == [(rid, 0, "ok")]


def test_a_take_over_committed_while_the_insert_waits_is_seen(pg_url) -> None:
    """PostgreSQL: the reaper takes the lease while a turn's transaction is open; the fenced
    insert that runs after it must see the new lease (a fence read from a stale snapshot, or
    one without the row lock, would log a turn for a worker that no longer owns the RUN)."""
    [rid] = _rollouts(pg_url, 1)
    engine = get_engine(pg_url)
    taker = engine.connect()
    taker.begin()
    taker.execute(sa.update(Rollout).where(Rollout.id == rid).values(lease_owner="reaper"))
    outcome: list[BaseException | None] = []

    def insert() -> None:
        try:
            with engine.begin() as conn:
                turn_log.write_turn(conn, rid, 1, f"L1-{rid}", {"index": 0})
            outcome.append(None)
        except LeaseLost as exc:
            outcome.append(exc)

    thread = threading.Thread(target=insert)
    thread.start()
    time.sleep(0.3)  # the insert now waits on the take-over's row lock
    assert not outcome
    taker.commit()
    taker.close()
    thread.join(10)
    assert outcome and isinstance(outcome[0], LeaseLost)
    assert _turns(pg_url) == []


def test_group_commit_keeps_each_rollouts_order_under_concurrent_threads(any_db_url) -> None:
    ids = _rollouts(any_db_url, 16)
    writer = turn_log.TurnWriter(any_db_url, window=0.02)
    writer.start()
    errors: list[BaseException] = []

    def loop(rid: str) -> None:
        try:
            for index in range(6):
                writer.record_turn(rid, 1, f"L1-{rid}", {"index": index, "text": f"{index}"})
                # Durable when record_turn returns: a second connection sees it at once.
                assert [t[1] for t in _turns(any_db_url, rid)] == list(range(index + 1))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(rid,)) for rid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    rows = _turns(any_db_url)
    assert len(rows) == 16 * 6
    for rid in ids:
        assert [i for r, i, _ in rows if r == rid] == list(range(6))  # insert order = index
    assert writer.writes == 16 * 6
    assert writer.batches < writer.writes / 2  # really grouped: fewer commits than turns


def test_a_refused_write_does_not_spoil_its_batch(any_db_url) -> None:
    a, b = _rollouts(any_db_url, 2)
    writer = turn_log.TurnWriter(any_db_url, window=0.2)  # both land in one batch
    writer.start()
    stale = writer.submit(a, lambda c: turn_log.write_turn(c, a, 1, "stale", {"index": 0}))
    good = writer.submit(b, lambda c: turn_log.write_turn(c, b, 1, f"L1-{b}", {"index": 0}))
    with pytest.raises(LeaseLost):
        stale.result(10)
    good.result(10)
    assert writer.batches == 1
    assert _turns(any_db_url) == [(b, 0, None)]


def test_a_clear_queued_before_a_turn_commits_before_it_and_never_after_a_new_mark(any_db_url) -> None:
    [rid] = _rollouts(any_db_url, 1)
    lease = f"L1-{rid}"
    with session_scope(any_db_url) as s:
        s.get(Rollout, rid).generating_on = "http://server"
    writer = turn_log.TurnWriter(any_db_url, window=0.1)
    writer.start()
    writer.clear_generating(rid, lease)  # no wait
    with session_scope(any_db_url) as s:  # not yet committed: the batch window is open
        assert s.get(Rollout, rid).generating_on == "http://server"
    writer.wait_cleared(rid, timeout=10)  # what the next mark does first
    with session_scope(any_db_url) as s:
        assert s.get(Rollout, rid).generating_on is None


def test_a_queued_turn_returns_before_its_commit_and_does_not_hold_back_the_next_mark(any_db_url) -> None:
    """The next generation overlaps the previous turn's commit: the mark waits for pending
    clears only, not for queued turns."""
    [rid] = _rollouts(any_db_url, 1)
    writer = turn_log.TurnWriter(any_db_url, window=0.5)
    writer.start()
    queued = writer.queue_turn(rid, 1, f"L1-{rid}", {"index": 0, "text": "t0"})
    assert not queued.done()
    started = time.monotonic()
    writer.wait_cleared(rid, timeout=10)
    assert time.monotonic() - started < 0.25  # not the batch window
    assert _turns(any_db_url) == []  # still in the open batch
    queued.result(10)
    assert _turns(any_db_url) == [(rid, 0, "t0")]


def _run_turns(db_url: str, rollout_id: str) -> object:
    from tasks.writes.run_turns import RunTurns

    writes = turn_log.TurnLog(db_url)
    writes.start()
    return RunTurns(writes, db_url, rollout_id, 1, f"L1-{rollout_id}", logging.getLogger("test"))


def test_settling_writes_again_a_turn_whose_batch_failed(sqlite_url) -> None:
    from concurrent.futures import Future

    from sqlalchemy.exc import OperationalError

    [rid] = _rollouts(sqlite_url, 1)
    run = _run_turns(sqlite_url, rid)
    failed: Future = Future()
    failed.set_exception(OperationalError("INSERT", {}, Exception("the database restarted")))
    run.unsettled.append((failed, {"index": 0, "text": "t0"}))  # its batch was lost
    run.record(index=1, text="t1")
    run.settle()
    assert sorted(_turns(sqlite_url, rid)) == [(rid, 0, "t0"), (rid, 1, "t1")]  # both durable
    assert run.unsettled == []


def test_settling_a_turn_the_fence_refused_raises_lease_lost(sqlite_url) -> None:
    [rid] = _rollouts(sqlite_url, 1)
    run = _run_turns(sqlite_url, rid)
    run.lease = "stale"
    run.record(index=0, text="t0")
    with pytest.raises(LeaseLost):
        run.settle()
    assert run.unsettled == [] and _turns(sqlite_url) == []


def test_a_failing_run_settles_its_queued_turns_without_masking_its_error(sqlite_url) -> None:
    """`RunTurns.settle_quietly`, on the way out of a RUN that raised: every queued turn is durable
    (the failure's handling sees them); a refused fence is logged, not raised over the
    failure, and nothing stays queued."""
    [rid] = _rollouts(sqlite_url, 1)
    run = _run_turns(sqlite_url, rid)
    run.record(index=0, text="t0")
    run.record(index=1, text="t1")
    run.settle_quietly()
    assert sorted(_turns(sqlite_url, rid)) == [(rid, 0, "t0"), (rid, 1, "t1")] and run.unsettled == []
    run.lease = "stale"
    run.record(index=2, text="t2")
    run.settle_quietly()  # no LeaseLost
    assert len(_turns(sqlite_url, rid)) == 2 and run.unsettled == []


@pytest.mark.parametrize("through", ["the process's turn log", "a transaction of its own"])
def test_lifecycle_record_turn_is_fenced_on_the_lease(sqlite_url, through) -> None:
    [rid] = _rollouts(sqlite_url, 1)
    writes = turn_log.TurnLog(sqlite_url, window=0) if through == "the process's turn log" else None
    if writes is not None:
        writes.start()
    lifecycle.record_turn(sqlite_url, rid, 1, lease=f"L1-{rid}", writes=writes, index=0, text="t0", weight_version="v1")
    with pytest.raises(LeaseLost):
        lifecycle.record_turn(sqlite_url, rid, 1, lease="L0", writes=writes, index=1)
    with session_scope(sqlite_url) as s:
        [turn] = s.scalars(sa.select(Turn)).all()
        assert (turn.index, turn.weight_version, turn.extra) == (0, "v1", {})
        assert turn.created_at is not None
    assert writes is None or writes.batches == 2


def _server(db_url: str, url: str = "http://sim:1") -> None:
    from core.models import LLMServer

    with session_scope(db_url) as s:
        s.add(LLMServer(url=url, model="m", weight_version="v1", owner="default"))


def test_the_mark_and_the_server_read_are_one_statement(any_db_url) -> None:
    """`begin_generation`: one UPDATE ... RETURNING marks the rollout and reads the row (the
    weight version a turn records); a paused server is read but not marked."""
    from tasks.llm.llm_pool import RegisteredPool
    from tasks.llm.pool_pause import set_paused

    [rid] = _rollouts(any_db_url, 1)
    _server(any_db_url)
    pool = RegisteredPool(any_db_url, "vllm", rid, f"L1-{rid}")
    engine = get_engine(any_db_url)
    statements: list[str] = []
    listener = lambda *a: statements.append(a[2])  # noqa: E731
    sa.event.listen(engine, "before_cursor_execute", listener)
    info = pool.begin_generation("http://sim:1")
    sa.event.remove(engine, "before_cursor_execute", listener)
    assert (info.weight_version, info.paused) == ("v1", False)
    assert len([s for s in statements if not s.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK"))]) == 1
    with session_scope(any_db_url) as s:
        assert s.get(Rollout, rid).generating_on == "http://sim:1"
        server_id = s.scalar(sa.text("SELECT id FROM llm_servers"))
    pool.end_generation()
    set_paused(any_db_url, "default", [server_id], True, weight_version="v2")
    info = pool.begin_generation("http://sim:1")
    assert (info.weight_version, info.paused) == ("v2", True)
    with session_scope(any_db_url) as s:
        assert s.get(Rollout, rid).generating_on is None  # paused: the mark writes no url
    assert pool.begin_generation("http://gone:1") is None
    with pytest.raises(LeaseLost):
        RegisteredPool(any_db_url, "vllm", rid, "stale").begin_generation("http://sim:1")


def test_a_mark_takes_back_the_queued_clear_and_no_late_clear_wipes_it(any_db_url) -> None:
    """The next generation does not wait for the previous mark's clear to commit: the mark
    takes the queued clear back (it writes the column itself), and nothing of the old
    generation lands after it."""
    from tasks.llm.llm_pool import RegisteredPool

    [rid] = _rollouts(any_db_url, 1)
    _server(any_db_url)
    writes = turn_log.TurnLog(any_db_url, 1.0)  # a wide batch window
    writes.start()
    pool = RegisteredPool(any_db_url, "vllm", rid, f"L1-{rid}", writes=writes)
    pool.begin_generation("http://sim:1")
    pool.end_generation()  # queued: the window is open
    started = time.monotonic()
    pool.begin_generation("http://sim:1")
    assert time.monotonic() - started < 0.5  # not the window
    writes.record_turn(rid, 1, f"L1-{rid}", {"index": 0})  # the next batch commits
    with session_scope(any_db_url) as s:
        assert s.get(Rollout, rid).generating_on == "http://sim:1"  # the new mark stands


def test_a_mark_racing_a_pause_is_either_seen_by_it_or_sees_it(pg_url) -> None:
    """PostgreSQL: a pause's UPDATE is open when a mark is attempted. The mark must wait and
    read the paused row (a read from the statement's snapshot would say "not paused" and
    mark after the pause counted the marks: a generation would run during a weight load)."""
    from core.models import LLMServer
    from tasks.llm.llm_pool import RegisteredPool
    from tasks.llm.pool_pause import generating

    [rid] = _rollouts(pg_url, 1)
    _server(pg_url)
    pool = RegisteredPool(pg_url, "vllm", rid, f"L1-{rid}")
    engine = get_engine(pg_url)
    pauser = engine.connect()
    pauser.begin()
    pauser.execute(sa.update(LLMServer).values(paused=True))
    seen: list = []
    thread = threading.Thread(target=lambda: seen.append(pool.begin_generation("http://sim:1")))
    thread.start()
    time.sleep(0.3)
    assert not seen  # waits on the pause's row lock
    pauser.commit()
    pauser.close()
    thread.join(10)
    assert seen and seen[0].paused
    assert generating(pg_url, "default", ["http://sim:1"], 30.0) == {}
    # The other order: a mark holding its share lock makes the pause's UPDATE wait for it.
    holder = engine.connect()
    holder.begin()
    holder.execute(sa.update(LLMServer).values(paused=False))
    holder.commit()
    holder.begin()
    holder.execute(*pool._mark_and_read("http://sim:1"))  # the statement, left uncommitted
    done = threading.Event()

    def pause() -> None:
        with engine.begin() as conn:
            conn.execute(sa.update(LLMServer).values(paused=True))
        done.set()

    threading.Thread(target=pause).start()
    assert not done.wait(0.3)  # the pause waits for the mark's transaction
    holder.commit()
    holder.close()
    assert done.wait(10)
    assert generating(pg_url, "default", ["http://sim:1"], 30.0) == {"http://sim:1": 1}
