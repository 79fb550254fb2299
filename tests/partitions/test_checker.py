"""The partition checker finds what it is for (fabricated histories, no services): a turn
committed after its attempt ended, after the rollout ended, below a resume's `from_turn`
after the resume, and a gap in an attempt's turn indexes; a clean history passes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from bench.support.partitions.checker import _late_turns

T0 = datetime(2026, 12, 6, tzinfo=timezone.utc)


def _turn(index: int, seconds: float) -> SimpleNamespace:
    return SimpleNamespace(index=index, committed=T0 + timedelta(seconds=seconds))


def _rollout(**fields) -> SimpleNamespace:
    base = {"id": "r1", "attempt_history": [], "resumes": [], "finished_at": None}
    return SimpleNamespace(**{**base, **fields})


def test_a_clean_history_passes() -> None:
    rollout = _rollout(
        attempt_history=[{"attempt": 1, "ended_at": (T0 + timedelta(seconds=10)).isoformat()}],
        finished_at=T0 + timedelta(seconds=30),
    )
    assert _late_turns(rollout, 1, [_turn(0, 1), _turn(1, 10.5)]) == []  # within the slack


def test_a_turn_after_its_attempt_ended_is_a_violation() -> None:
    rollout = _rollout(attempt_history=[{"attempt": 1, "ended_at": (T0 + timedelta(seconds=10)).isoformat()}])
    [found] = _late_turns(rollout, 1, [_turn(0, 1), _turn(1, 25)])
    assert "turn 1 committed 15.0s after its end" in found


def test_a_turn_after_the_rollout_ended_is_a_violation() -> None:
    rollout = _rollout(finished_at=T0 + timedelta(seconds=5))
    [found] = _late_turns(rollout, 2, [_turn(0, 9)])
    assert "after the rollout ended" in found


def test_a_turn_below_from_turn_after_the_resume_is_a_violation() -> None:
    resume = {"attempt": 1, "stage": "run", "from_turn": 2, "at": (T0 + timedelta(seconds=10)).isoformat()}
    rollout = _rollout(resumes=[resume])
    [found] = _late_turns(rollout, 1, [_turn(0, 1), _turn(1, 14), _turn(2, 15)])
    assert "turn 1 < from_turn 2" in found  # turn 2 is the resumed RUN's own
