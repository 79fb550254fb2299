"""Hand-on marks cleared in batches off the stage's thread (`tasks.writes.outbox_marks`): each clear
is fenced on the exact mark it is for, on SQLite and PostgreSQL."""

from __future__ import annotations

from core.db import session_scope
from core.models import Job, Rollout
from migrations.runner import upgrade
from tasks.writes import lifecycle, outbox_marks


def _leased(db_url: str, n: int) -> list[str]:
    upgrade(db_url)
    with session_scope(db_url) as s:
        job = Job(owner="default", agent="test-trivial", config={}, n_instances=n)
        s.add(job)
        s.flush()
        ids = [f"r{k}" for k in range(n)]
        s.add_all(
            [Rollout(id=rid, job_id=job.id, instance_id=rid, status="init", lease_owner=f"L-{rid}") for rid in ids]
        )
    return ids


def _marks(db_url: str) -> dict[str, bool]:
    with session_scope(db_url) as s:
        return {r.id: r.outbox_at is not None for r in s.query(Rollout).order_by(Rollout.id)}


def test_queued_clears_share_one_statement_and_touch_only_their_own_mark(any_db_url) -> None:
    a, b, c = _leased(any_db_url, 3)
    marks = {rid: lifecycle.hand_off(any_db_url, rid, f"L-{rid}", "run") for rid in (a, b, c)}
    assert all(handed and at is not None for handed, at in marks.values())
    assert _marks(any_db_url) == {a: True, b: True, c: True}
    # c's hand-on was claimed and handed on again (resumed, say) before its clear ran: the
    # clear is for the old mark and must leave the new one alone.
    with session_scope(any_db_url) as s:
        s.get(Rollout, c).lease_owner = "L2"
    assert lifecycle.hand_off(any_db_url, c, "L2", "run")[0]
    clearer = outbox_marks.MarkClearer(any_db_url, delay=0.2)
    clearer.start()
    for rid in (a, b, c):
        clearer.clear(outbox_marks.Mark(rid, 1, "run", marks[rid][1]))
    clearer.flush()
    assert clearer.statements == 1
    assert _marks(any_db_url) == {a: False, b: False, c: True}


def test_a_clear_after_the_claim_changes_nothing(any_db_url) -> None:
    [a] = _leased(any_db_url, 1)
    _, at = lifecycle.hand_off(any_db_url, a, f"L-{a}", "run")
    claimed = lifecycle.claim(any_db_url, a, 1, "run", "L-run", None)
    assert claimed is not None and not _marks(any_db_url)[a]
    assert outbox_marks.clear_now(any_db_url, [outbox_marks.Mark(a, 1, "run", at)]) == 0
