"""Cancel as set operations, on SQLite and PostgreSQL: one statement ends every rollout queued
for INIT with gapless completion numbers and correct group flags; started ones are left to
their workers (cooperative cancel) and still number after."""

from __future__ import annotations

import sqlalchemy as sa

from core.db import session_scope
from core.models import Job, Rollout, Status, new_id, utcnow
from migrations.runner import upgrade
from tasks.writes import cancels, lifecycle, terminal


def _job(db: str, groups: dict[str, list[str]]) -> tuple[str, dict[tuple[str, int], str]]:
    """A job whose instance `i` has samples in the given statuses (leased when started)."""
    now = utcnow()
    n_samples = len(next(iter(groups.values())))
    job = Job(owner="o", agent="test-trivial", config={}, n_instances=len(groups), n_samples=n_samples)
    ids: dict[tuple[str, int], str] = {}
    rows = []
    for inst, statuses in groups.items():
        for k, status in enumerate(statuses):
            rid = ids[(inst, k)] = new_id()
            rows.append(
                {
                    "id": rid,
                    "instance_id": inst,
                    "sample_index": k,
                    "status": status,
                    "lease_owner": "w/1" if status in ("init", "run") else None,
                    "node": "n",
                    "queued_at": now,
                    "created_at": now,
                    "outbox_at": now,
                }
            )
    with session_scope(db) as s:
        s.add(job)
        s.flush()
        for row in rows:
            row["job_id"] = job.id
        s.execute(sa.insert(Rollout), rows)
        job_id = job.id
    return job_id, ids


def _rows(db: str, job_id: str) -> dict[str, Rollout]:
    with session_scope(db) as s:
        return {r.id: r for r in s.scalars(sa.select(Rollout).where(Rollout.job_id == job_id))}


def test_cancel_ends_queued_in_one_go_and_keeps_the_cursor_gapless(any_db_url):
    db = any_db_url
    upgrade(db)
    job_id, ids = _job(
        db,
        {
            "a": ["pending", "pending", "pending"],  # all queued: the last completes the group
            "b": ["pending", "run", "pending"],  # a sibling runs: it completes the group later
            "c": ["done", "pending", "eval"],  # eval queued (no lease): its worker ends it
        },
    )
    # one rollout had finished before the cancel and holds seq 1
    with session_scope(db) as s:
        s.execute(sa.update(Rollout).where(Rollout.id == ids[("c", 0)]).values(result_seq=1))
        s.execute(sa.update(Job).where(Job.id == job_id).values(finished_count=1))

    assert cancels.cancel_job(db, job_id) == 6
    rows = _rows(db, job_id)
    cancelled = sorted((r for r in rows.values() if r.status == "cancelled"), key=lambda r: r.result_seq)
    assert [(r.instance_id, r.sample_index) for r in cancelled] == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("b", 0),
        ("b", 2),
        ("c", 1),
    ]
    assert [r.result_seq for r in cancelled] == [2, 3, 4, 5, 6, 7]
    by_key = {(r.instance_id, r.sample_index): r for r in rows.values()}
    assert [by_key[("a", k)].completes_group for k in range(3)] == [False, False, True]
    assert not any(by_key[("b", k)].completes_group for k in range(3))
    assert not by_key[("c", 1)].completes_group  # c's eval sample is still open
    for r in cancelled:
        assert (r.outcome, r.error, r.lease_owner, r.outbox_at) == (
            "cancelled",
            "cancelled",
            None,
            None,
        ) and r.finished_at is not None
    # started rollouts are flagged, untouched otherwise: they stop cooperatively
    for key in (("b", 1), ("c", 2)):
        assert by_key[key].cancel_requested and by_key[key].result_seq is None
    assert by_key[("b", 1)].status == "run" and by_key[("b", 1)].lease_owner == "w/1"
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert job.cancel_requested and job.finished_count == 7 and job.finished_at is None
    # a queued message now finds nothing to claim, and its worker learns the job is cancelled
    assert lifecycle.claim(db, ids[("a", 0)], 1, "init", "w/2", "n") is None
    memory = cancels.CancelMemory()  # a worker process's
    assert not memory.known_cancelled(job_id)
    assert memory.note_if_cancelled(db, job_id) and memory.known_cancelled(job_id)

    # the running ones end through the usual terminal write: numbered after, group flags right
    assert terminal.finish(db, ids[("b", 1)], Status.CANCELLED, "cancelled", lease="w/1")
    assert lifecycle.claim(db, ids[("c", 2)], 1, "eval", "w/3", "n") is not None
    assert terminal.finish(db, ids[("c", 2)], Status.CANCELLED, "cancelled", lease="w/3")
    rows = _rows(db, job_id)
    assert sorted(r.result_seq for r in rows.values()) == list(range(1, 10))
    assert rows[ids[("b", 1)]].completes_group and rows[ids[("c", 2)]].completes_group
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert job.finished_count == 9 and job.finished_at is not None

    # cancelling again changes nothing
    assert cancels.cancel_job(db, job_id) == 0
    assert sorted(r.result_seq for r in _rows(db, job_id).values()) == list(range(1, 10))


def test_cancel_of_an_all_queued_job_finishes_it(any_db_url):
    db = any_db_url
    upgrade(db)
    job_id, _ = _job(db, {f"i{k}": ["pending"] * 4 for k in range(50)})
    assert cancels.cancel_job(db, job_id) == 200
    rows = _rows(db, job_id).values()
    assert sorted(r.result_seq for r in rows) == list(range(1, 201))
    assert sum(r.completes_group for r in rows) == 50
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert job.finished_count == 200 and job.finished_at is not None
