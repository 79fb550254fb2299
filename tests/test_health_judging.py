"""Judging a job's health on real databases (SQLite and PostgreSQL, migrated): rows written as
the terminal write leaves them, then `tasks.watch.health_alerts.check_job` as the reaper calls it.

What the service test (`tests/test_health_alerts.py`) cannot pin down with its timing: an alert
names the rollout at which its window first crossed however late the judging; it is raised once
across judges (two caches, as two processes); it clears only after a whole window of later
rollouts is back within the threshold; a critical alert of an `on_critical: cancel` job
cancels its queued rollouts; the per-version figures and the incremental cache.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from core.db import session_scope
from core.models import Callback, Job, JobAlert, Rollout
from migrations.runner import upgrade
from tasks.watch.health import HealthCache, figures
from tasks.watch.health_alerts import check_job, check_running


def make_job(db_url: str, health: dict[str, Any], callback: str | None = None) -> str:
    upgrade(db_url)
    with session_scope(db_url) as s:
        job = Job(agent="math", config={"health": health}, n_instances=50, n_samples=1, callback_url=callback)
        s.add(job)
        s.flush()
        return job.id


def finish(
    db_url: str,
    job_id: str,
    seq: int,
    *,
    turns: int = 3,
    tools: int = 2,
    malformed: int = 0,
    metrics: dict[str, Any] | None = None,
    **row: Any,
):
    """One finished rollout as the terminal write stores it (`metrics` as given, else the
    counters' names of `agents.counters`)."""
    if metrics is None:
        metrics = {"turns": turns, "tool_calls": tools, "malformed_tool_calls": malformed, "gen_seconds": 0.5}
    values = {"outcome": "completed", "reward": 1.0, "finish_reason": "finish", "policy_versions": ["v1"]}
    values.update(row)
    with session_scope(db_url) as s:
        s.add(
            Rollout(
                job_id=job_id,
                instance_id=f"i{seq // 2}",
                sample_index=seq % 2,
                status="done",
                result_seq=seq,
                metrics=metrics,
                **values,
            )
        )


def alerts(db_url: str, job_id: str) -> list[JobAlert]:
    with session_scope(db_url) as s:
        return list(s.scalars(select(JobAlert).where(JobAlert.job_id == job_id).order_by(JobAlert.id)))


def test_late_judging_names_the_crossing_rollout_and_raises_once(any_db_url) -> None:
    job_id = make_job(any_db_url, {"window": 4, "min_rollouts": 4}, callback="http://127.0.0.1:9/hook")
    for seq in range(1, 9):
        finish(any_db_url, job_id, seq)
    assert check_job(any_db_url, job_id, HealthCache()) == []
    for seq in range(9, 17):  # collapsed to one turn from rollout 9; judged only at 16
        finish(any_db_url, job_id, seq, turns=1, tools=1)
    first, second = HealthCache(), HealthCache()  # two judges (two processes)
    raised = check_job(any_db_url, job_id, first)
    assert [(a.name, a.seq) for a in raised] == [("turns_collapse", 11)]  # 3, 1, 1, 1: mean 1.5
    assert raised[0].weight_version == "v1" and raised[0].severity == "warning"
    assert check_job(any_db_url, job_id, second) == [] and check_job(any_db_url, job_id, first) == []
    assert len(alerts(any_db_url, job_id)) == 1
    with session_scope(any_db_url) as s:
        (callback,) = s.scalars(select(Callback).where(Callback.job_id == job_id)).all()
        assert callback.event == "alert" and callback.payload["alert"]["name"] == "turns_collapse"


def test_an_alert_clears_after_a_whole_healthy_window_and_can_fire_again(any_db_url) -> None:
    job_id = make_job(any_db_url, {"window": 4, "min_rollouts": 4})
    cache = HealthCache()
    for seq in range(1, 5):
        finish(any_db_url, job_id, seq, malformed=2, tools=0, reward=0.0)
    assert [a.name for a in check_job(any_db_url, job_id, cache)] == ["parse_failures"]
    for seq in range(5, 8):  # three healthy: the window still holds one garbled rollout
        finish(any_db_url, job_id, seq)
    check_job(any_db_url, job_id, cache)
    assert alerts(any_db_url, job_id)[0].cleared_at is None
    finish(any_db_url, job_id, 8)
    check_job(any_db_url, job_id, cache)
    assert alerts(any_db_url, job_id)[0].cleared_at is not None
    for seq in range(9, 11):
        finish(any_db_url, job_id, seq, malformed=3, tools=0, reward=0.0)
    assert [(a.name, a.seq) for a in check_job(any_db_url, job_id, cache)] == [("parse_failures", 9)]


def test_a_critical_alert_cancels_a_job_that_asks_for_it(any_db_url) -> None:
    job_id = make_job(any_db_url, {"window": 4, "min_rollouts": 4, "critical": ["infra"], "on_critical": "cancel"})
    for seq in range(1, 5):
        finish(any_db_url, job_id, seq, outcome="infra_error", reward=None, finish_reason=None)
    with session_scope(any_db_url) as s:
        s.add(Rollout(job_id=job_id, instance_id="queued", status="pending"))
    assert check_running(any_db_url, HealthCache()) == 1
    (alert,) = alerts(any_db_url, job_id)
    assert (alert.name, alert.severity, alert.action) == ("infra", "critical", "cancelled")
    with session_scope(any_db_url) as s:
        queued = s.scalars(select(Rollout).where(Rollout.instance_id == "queued")).one()
        assert queued.status == "cancelled"


def test_figures_per_version_and_incremental_reads(sqlite_url) -> None:
    from tasks.watch.health import by_weight_version, figures

    job_id = make_job(sqlite_url, {})
    cache = HealthCache()
    finish(sqlite_url, job_id, 1, turns=4, tools=3, malformed=1, finish_reason="turn_length")
    with session_scope(sqlite_url) as s:
        assert len(cache.samples(s, job_id)) == 1
    finish(sqlite_url, job_id, 2, turns=1, tools=0, reward=1.0, policy_versions=["v2"])
    finish(sqlite_url, job_id, 3, turns=2, tools=1, reward=0.0, policy_versions=["v1", "v2"])
    with session_scope(sqlite_url) as s:
        samples = cache.samples(s, job_id)
    assert [x.seq for x in samples] == [1, 2, 3]
    f = figures(samples)
    assert f.turns_hist == {"1": 1, "2": 1, "4": 1} and f.turns_mean == pytest.approx(7 / 3, abs=1e-3)
    assert f.parse_failure_rate == 0.2  # 1 malformed of 5 attempted
    assert f.truncation_rate == pytest.approx(1 / 3, abs=1e-3)
    assert f.reward_without_tools == 0.5  # rewarded: #1 (3 tools) and #2 (none)
    assert set(by_weight_version(samples)) == {"v1", "v2"} and by_weight_version(samples)["v2"].rollouts == 2


def test_harness_rows_stored_under_the_old_names_are_judged_like_new_ones(any_db_url) -> None:
    """A harness rollout stored before the loop's and the harness's counters had one name each
    carries `parse_failures` / `tool_calls_failed` and `tool_calls_parsed`: health reads them
    as `malformed_tool_calls` and `tool_calls`, so those rows still raise the alert."""
    job_id = make_job(any_db_url, {"window": 4, "min_rollouts": 4})
    old = {"calls": 3, "turns": 3, "tool_calls": 1, "tool_calls_parsed": 1, "parse_failures": 2, "tool_calls_failed": 2}
    for seq in range(1, 5):
        finish(any_db_url, job_id, seq, metrics=old)
    cache = HealthCache()
    assert [a.name for a in check_job(any_db_url, job_id, cache)] == ["parse_failures"]
    with session_scope(any_db_url) as s:
        found = figures(cache.samples(s, job_id))
    assert (found.tool_calls_mean, found.parse_failure_rate) == (1.0, pytest.approx(2 / 3, abs=0.01))


def test_a_critical_alert_pauses_a_job_that_asks_for_it(any_db_url) -> None:
    """`on_critical: pause`: the alert says so, the job is paused with the alert as its reason,
    its queued rollout waits (not cancelled), and the resume marks it for publication."""
    from tasks.writes import pauses

    job_id = make_job(any_db_url, {"window": 4, "min_rollouts": 4, "critical": ["infra"], "on_critical": "pause"})
    for seq in range(1, 5):
        finish(any_db_url, job_id, seq, outcome="infra_error", reward=None, finish_reason=None)
    with session_scope(any_db_url) as s:
        s.add(Rollout(job_id=job_id, instance_id="queued", status="pending"))
    assert check_running(any_db_url, HealthCache()) == 1
    (alert,) = alerts(any_db_url, job_id)
    assert (alert.name, alert.severity, alert.action) == ("infra", "critical", "paused")
    with session_scope(any_db_url) as s:
        job = s.get(Job, job_id)
        assert job.paused_at is not None and job.pause_reason.startswith("critical health alert infra")
        queued = s.scalars(select(Rollout).where(Rollout.instance_id == "queued")).one()
        assert (queued.status, queued.outbox_at) == ("pending", None)
    assert pauses.pause_job(any_db_url, job_id, "again") is False  # the first reason is kept
    [rid] = pauses.resume_job(any_db_url, job_id)
    with session_scope(any_db_url) as s:
        assert s.get(Job, job_id).paused_at is None
        assert s.get(Rollout, rid).outbox_at is not None
    assert pauses.resume_job(any_db_url, job_id) == []
