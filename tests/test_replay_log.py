"""Which logged turns a new attempt replays (`tasks.recovery.resume.turns_to_resume`) when the
attempt before it was itself lost in the middle of a replay: that attempt's log is a prefix of
the one it replayed, and the rest of the older log is offered too (never generated again)."""

from __future__ import annotations

from types import SimpleNamespace

from core.db import session_scope
from core.models import Job, Rollout, Turn
from migrations.runner import upgrade
from tasks.recovery.resume import turns_to_resume


def _log(db_url: str, turns: list[tuple[int, int, dict]]) -> SimpleNamespace:
    upgrade(db_url)
    with session_scope(db_url) as s:
        job = Job(owner="default", agent="harness", config={}, n_instances=1)
        s.add(job)
        s.flush()
        s.add(Rollout(id="r1", job_id=job.id, instance_id="i", status="run", attempt=3))
        s.flush()
        for attempt, index, extra in turns:
            s.add(Turn(rollout_id="r1", attempt=attempt, index=index, text=f"{attempt}.{index}", extra=extra))
    return SimpleNamespace(id="r1", resumes=None, attempt_history=None)


def _got(db_url: str, rollout: SimpleNamespace, attempt: int = 3) -> list[tuple[int, int]]:
    return [(t["attempt"], t["index"]) for t in turns_to_resume(db_url, rollout, attempt, True) or []]


def test_an_attempt_lost_mid_replay_offers_the_rest_of_the_log_it_replayed(sqlite_url) -> None:
    replayed = {"replayed_from_attempt": 1}
    rollout = _log(sqlite_url, [(1, i, {}) for i in range(4)] + [(2, 0, replayed), (2, 1, replayed)])
    assert _got(sqlite_url, rollout) == [(2, 0), (2, 1), (1, 2), (1, 3)]


def test_an_attempt_that_went_live_offers_only_its_own_log(sqlite_url) -> None:
    turns = [(1, i, {}) for i in range(4)] + [(2, 0, {"replayed_from_attempt": 1}), (2, 1, {})]
    rollout = _log(sqlite_url, turns)
    assert _got(sqlite_url, rollout) == [
        (2, 0),
        (2, 1),
    ]  # its call 1 was live: attempt 1's later ones are not its record


def test_replay_off_offers_nothing(sqlite_url) -> None:
    rollout = _log(sqlite_url, [(1, 0, {})])
    assert turns_to_resume(sqlite_url, rollout, 2, False) is None
