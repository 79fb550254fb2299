"""Health alerts: judging each running job's recent rollouts against its thresholds.

Off the hot path: the stages write nothing for it. Judges are the reaper's pass (every running
job, so callbacks go out with nobody watching) and the gateway when it serves a job's event
stream or health (so an alert reaches the stream with the rollouts that caused it). A judge
reads, per job, the rollouts finished since its last look (`tasks.watch.health.HealthCache`), judges the last
`health.window` of them against the job's thresholds (`agents.health_config.HealthConfig`) and,
under the job's row lock (several nodes' reapers may judge the same job), raises an alert that
is not already active: a `job_alerts` row, which the job's event stream sends as an `alert`
event, and a signed `alert` callback in the callback outbox when the job has a `callback_url`.
An active alert is cleared once its figure is back within the threshold over a whole window of
rollouts that finished after it was raised (so rollouts finishing out of order do not make it
flap); it may then fire again.
A critical alert of a job with `on_critical: cancel` cancels the job; with `on_critical: pause`
it pauses it (`tasks.writes.pauses`: queued rollouts wait for a resume, started ones finish).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from raas_client.health_models import AlertView, HealthFigures
from sqlalchemy import insert, or_, select

from agents.health_config import HealthConfig
from agents.job_config import JobConfig
from core.db import session_scope
from core.models import Callback, Job, JobAlert, utcnow
from tasks.watch.health import HealthCache, Sample, figures

log = logging.getLogger(__name__)
RECENTLY_FINISHED = timedelta(seconds=60)  # judged once more after the job ends
FIRST_LOOK = 10  # windows a process judges of a job it has not judged before

# alert name -> (figure of `recent`, threshold field of HealthConfig, fires when at or below)
RULES: dict[str, tuple[str, str, bool]] = {
    "turns_collapse": ("turns_mean", "turns_mean_at_most", True),
    "parse_failures": ("parse_failure_rate", "parse_failure_rate_at_least", False),
    "reward_without_tools": ("reward_without_tools", "reward_without_tools_at_least", False),
    "truncation": ("truncation_rate", "truncation_rate_at_least", False),
    "infra": ("infra_rate", "infra_rate_at_least", False),
}
LABELS = {
    "turns_collapse": "turns per rollout collapsed",
    "parse_failures": "tool calls do not parse",
    "reward_without_tools": "reward earned without tool calls",
    "truncation": "replies cut at the token limit",
    "infra": "infrastructure failures",
}


def crossed(config: HealthConfig, recent: HealthFigures) -> dict[str, tuple[float, float]]:
    """{alert: (value, threshold)} of every threshold `recent` crosses."""
    if recent.rollouts < config.min_rollouts:
        return {}
    out = {}
    for name, (figure, field, at_most) in RULES.items():
        value, threshold = getattr(recent, figure), getattr(config, field)
        if value is None or threshold is None:
            continue
        if (value <= threshold) if at_most else (value >= threshold):
            out[name] = (float(value), float(threshold))
    return out


def alert_view(row: JobAlert) -> AlertView:
    """The wire view of an alert row."""
    return AlertView.model_validate(row, from_attributes=True)


def _raise(
    s: Any, job: Job, config: HealthConfig, name: str, value: float, threshold: float, samples: list[Sample]
) -> JobAlert:
    """Insert one alert (and its callback) in the judging transaction."""
    severity = "critical" if name in config.critical else "warning"
    versions = [x.weight_version for x in samples if x.weight_version]
    action = {"cancel": "cancelled", "pause": "paused"}.get(config.on_critical) if severity == "critical" else None
    side = "<=" if RULES[name][2] else ">="
    row = JobAlert(
        job_id=job.id,
        name=name,
        severity=severity,
        value=round(value, 4),
        threshold=threshold,
        seq=samples[-1].seq,
        weight_version=versions[-1] if versions else None,
        message=f"{LABELS[name]}: {RULES[name][0]} {value:.3g} {side} {threshold:g} "
        f"over the last {len(samples)} rollouts",
        action=action or "none",
        raised_at=utcnow(),
    )
    s.add(row)
    s.flush()
    if job.callback_url:
        payload = {"event": "alert", "job_id": job.id, "alert": alert_view(row).model_dump(mode="json")}
        now = utcnow()
        s.execute(
            insert(Callback),
            [
                {
                    "job_id": job.id,
                    "owner": job.owner,
                    "url": job.callback_url,
                    "event": "alert",
                    "payload": payload,
                    "attempts": 0,
                    "next_at": now,
                    "created_at": now,
                }
            ],
        )
    return row


def _first_unjudged(cache: HealthCache, job_id: str, samples: list[Sample], rows: list[JobAlert], window: int) -> int:
    """Index of the first sample to judge: after this process's last judging and after the
    job's newest alert (whoever raised it judged every rollout before it); a process that has
    not judged the job looks back at most `FIRST_LOOK` windows."""
    skipped = len(samples) - FIRST_LOOK * window
    first_look = samples[skipped - 1].seq if skipped > 0 else 0
    mark = max([cache.judged.get(job_id, first_look)] + [a.seq for a in rows])
    return bisect.bisect_right(samples, mark, key=lambda x: x.seq)


@dataclass
class _Decision:
    """What judging found: an alert to raise (with its window) or an active one to clear."""

    name: str
    window: list[Sample]
    hit: tuple[float, float] | None  # (value, threshold) to raise; None: clear


def _judge(config: HealthConfig, samples: list[Sample], start: int, active: dict[str, int]) -> list[_Decision]:
    """Judge the window ending at every sample from `start` on; `active`: {alert: its seq}."""
    active, decisions = dict(active), []
    for end in range(start, len(samples)):
        window = samples[max(0, end + 1 - config.window) : end + 1]
        hits = crossed(config, figures(window))
        for name in [n for n, seq in active.items() if n not in hits and window[0].seq > seq]:
            active.pop(name)  # back for a whole window judged after it: cleared
            decisions.append(_Decision(name, window, None))
        for name, hit in hits.items():
            if name not in active:
                active[name] = window[-1].seq
                decisions.append(_Decision(name, window, hit))
    return decisions


def check_job(db_url: str, job_id: str, cache: HealthCache) -> list[AlertView]:
    """Judge one job at every rollout finished since it was last judged (an alert names the
    rollout at which its window first crossed, however late the judging); the alerts raised
    now (those that ask to cancel the job have done so).

    Judging only reads; the job's row is locked (so that two judges raise an alert once) only
    when an alert is to be raised or cleared: the terminal write, which counts on the same row,
    never waits for a judging that changes nothing."""
    with session_scope(db_url) as s:
        job = s.get(Job, job_id)
        if job is None:
            return []
        config = JobConfig.load(job.config).health
        samples = cache.samples(s, job_id)
        rows = list(s.scalars(select(JobAlert).where(JobAlert.job_id == job_id)))
    start = _first_unjudged(cache, job_id, samples, rows, config.window)
    decisions = _judge(config, samples, start, {a.name: a.seq for a in rows if a.cleared_at is None})
    if samples:
        cache.judged[job_id] = samples[-1].seq
    return _apply(db_url, job_id, config, decisions) if decisions else []


def _apply(db_url: str, job_id: str, config: HealthConfig, decisions: list[_Decision]) -> list[AlertView]:
    """Raise and clear under the job's row lock (what another judge did meanwhile stands)."""
    raised: list[AlertView] = []
    with session_scope(db_url) as s:
        job = s.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
        active = {
            a.name: a
            for a in s.scalars(select(JobAlert).where(JobAlert.job_id == job_id, JobAlert.cleared_at.is_(None)))
        }
        for d in decisions:
            if d.hit is None and d.name in active and d.window[0].seq > active[d.name].seq:
                active.pop(d.name).cleared_at = utcnow()
            elif d.hit is not None and d.name not in active:
                active[d.name] = _raise(s, job, config, d.name, *d.hit, d.window)
                raised.append(alert_view(active[d.name]))
    if any(a.action == "cancelled" for a in raised):
        from tasks.writes import cancels

        log.warning("job %s: critical health alert, cancelling (on_critical: cancel)", job_id)
        cancels.cancel_job(db_url, job_id)
    elif first := next((a for a in raised if a.action == "paused"), None):
        from tasks.writes import pauses

        pauses.pause_job(db_url, job_id, f"critical health alert {first.name}: {first.message}")
    for alert in raised:
        log.warning("job %s: health alert %s: %s", job_id, alert.name, alert.message)
    return raised


def check_running(db_url: str, cache: HealthCache) -> int:
    """One pass over the running (and just finished) jobs; how many alerts were raised."""
    since = utcnow() - RECENTLY_FINISHED
    with session_scope(db_url) as s:
        job_ids = list(s.scalars(select(Job.id).where(or_(Job.finished_at.is_(None), Job.finished_at >= since))))
    raised = 0
    for job_id in job_ids:
        try:
            raised += len(check_job(db_url, job_id, cache))
        except Exception:  # one job's bad config must not stop the pass
            log.exception("health check of job %s failed", job_id)
    return raised


def job_alerts(s: Any, job_id: str, after_id: int = 0) -> list[JobAlert]:
    """The job's alerts with an id above `after_id`, oldest first."""
    return list(
        s.scalars(select(JobAlert).where(JobAlert.job_id == job_id, JobAlert.id > after_id).order_by(JobAlert.id))
    )
