"""Prometheus metrics, computed at scrape time from the two sources of truth.

Queue depths come from the broker (including the unrouted queue nobody consumes: a value
above zero is a routing bug); rollout counts, stage-duration histograms and the inference
servers come from the database, so every gateway reports the same numbers no matter which
worker did the work. The functions here are also what the dashboard's stage view shows.

Live health (issue 37) is exported per running (or just finished) job: `raas_job_health`
(the figures of its last `health.window` rollouts, labelled by figure) and
`raas_job_health_by_version` (its figures per weight version), and `raas_job_alert_active`
(1 while an alert of the job is active). Labels are job ids and version strings: bounded by the
jobs running at once (`HEALTH_JOBS` at most).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from sqlalchemy import case, func, select

from core.db import session_scope
from core.models import LLMServer, Rollout
from tasks.broker.queues import known_queues, queue_depths

log = logging.getLogger(__name__)
BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
CONSUMERS_TIMEOUT = 0.5  # seconds to collect workers' replies to the active_queues broadcast
CONSUMERS_TTL = 5.0  # reuse one broadcast for this long: scrapes and page refreshes are cheap
_consumers_cache: dict[int, tuple[float, dict[str, list[str]]]] = {}
_consumers_lock = threading.Lock()


def worker_queues(celery: Any) -> dict[str, list[str]]:
    """Queues each live worker pool consumes, by worker name (Celery's active_queues
    broadcast, cached for CONSUMERS_TTL).

    The broker cannot tell (Redis reports no consumers of a list), so the
    workers are asked; one that does not answer within CONSUMERS_TIMEOUT is not counted.
    """
    with _consumers_lock:
        cached = _consumers_cache.get(id(celery))
        if cached and time.monotonic() - cached[0] < CONSUMERS_TTL:
            return dict(cached[1])
        replies = celery.control.inspect(timeout=CONSUMERS_TIMEOUT).active_queues() or {}
        workers = {name: [q["name"] for q in queues or []] for name, queues in replies.items()}
        _consumers_cache[id(celery)] = (time.monotonic(), workers)
    return dict(workers)


def queue_consumers(celery: Any) -> dict[str, int]:
    """Live worker pools consuming each queue."""
    counts: dict[str, int] = {}
    for queues in worker_queues(celery).values():
        for queue in queues:
            counts[queue] = counts.get(queue, 0) + 1
    return counts


def rollout_counts(s: Any, owner: str | None = None) -> list[tuple[str, str | None, int]]:
    """(status, outcome, count) over all rollouts, or over one owner's jobs."""
    from core.models import Job

    q = select(Rollout.status, Rollout.outcome, func.count()).group_by(Rollout.status, Rollout.outcome)
    if owner is not None:
        q = q.join(Job, Job.id == Rollout.job_id).where(Job.owner == owner)
    return [(status, outcome, n) for status, outcome, n in s.execute(q)]


def llm_servers(s: Any, owner: str | None = None) -> list[LLMServer]:
    """The registered inference servers (health and in-flight counts), all or one owner's,
    oldest first."""
    q = select(LLMServer).order_by(LLMServer.created_at, LLMServer.id)
    if owner is not None:
        q = q.where(LLMServer.owner == owner)
    return list(s.scalars(q))


class RaasCollector:
    """Collects raas metrics on every scrape."""

    def __init__(self, db_url: str, celery: Any, health_cache: Any = None) -> None:
        self.db_url = db_url
        self.celery = celery
        self.health_cache = health_cache

    def collect(self):
        """Yield the metric families."""
        depth = GaugeMetricFamily("raas_queue_depth", "Messages waiting per queue", labels=["queue"])
        consumers = GaugeMetricFamily("raas_queue_consumers", "Worker pools consuming each queue", labels=["queue"])
        try:
            queues = known_queues(self.db_url)
            for queue, n in queue_depths(self.celery, queues).items():
                depth.add_metric([queue], n)
            live = queue_consumers(self.celery)
            for queue in sorted(set(queues) | set(live)):
                consumers.add_metric([queue], live.get(queue, 0))
        except Exception:
            log.exception("reading queue depths failed")
        yield depth
        yield consumers
        yield from self._database()
        try:
            yield from job_health_families(self.db_url, self.health_cache)
        except Exception:
            log.exception("reading job health failed")

    def _database(self):
        by_status = GaugeMetricFamily("raas_rollouts", "Rollouts by status and outcome", labels=["status", "outcome"])
        in_flight = GaugeMetricFamily(
            "raas_llm_server_in_flight", "Rollouts stuck to each inference server", labels=["server"]
        )
        healthy = GaugeMetricFamily("raas_llm_server_healthy", "1 if the server is healthy", labels=["server"])
        with session_scope(self.db_url) as s:
            for status, outcome, n in rollout_counts(s):
                by_status.add_metric([status, outcome or ""], n)
            yield by_status
            for server in llm_servers(s):  # labelled by id: /metrics is open, urls may not be
                in_flight.add_metric([server.id], server.in_flight)
                healthy.add_metric([server.id], int(server.healthy))
            yield in_flight
            yield healthy
            outbox = GaugeMetricFamily(
                "raas_outbox_rollouts", "Rollouts accepted or handed on, not yet published to the broker"
            )
            outbox.add_metric(
                [], s.scalar(select(func.count()).select_from(Rollout).where(Rollout.outbox_at.is_not(None)))
            )
            yield outbox
            for stage in ("init", "run", "eval"):
                yield self._histogram(s, stage)

    def _histogram(self, s: Any, stage: str) -> HistogramMetricFamily:
        col = getattr(Rollout, f"{stage}_seconds")
        cols = [func.sum(case((col <= b, 1), else_=0)) for b in BUCKETS]
        row = s.execute(select(func.count(col), func.coalesce(func.sum(col), 0.0), *cols)).one()
        count, total, *cum = row
        buckets = [(str(b), int(c or 0)) for b, c in zip(BUCKETS, cum)] + [("+Inf", int(count))]
        hist = HistogramMetricFamily(f"raas_stage_{stage}_seconds", f"Seconds spent in {stage} (queue time excluded)")
        hist.add_metric([], buckets, float(total))
        return hist


HEALTH_JOBS = 50
HEALTH_FIGURES = (
    "turns_mean",
    "turns_p90",
    "parse_failure_rate",
    "truncation_rate",
    "zero_tool_rollouts",
    "reward_without_tools",
    "drift_rate",
    "infra_rate",
    "timeout_rate",
    "reward_mean",
    "reward_var",
    "zero_variance_groups",
)


def job_health_families(db_url: str, cache: Any = None):
    """Gauge families of the live health of the running (and just finished) jobs."""
    from sqlalchemy import or_

    from agents.job_config import JobConfig
    from core.models import Job, JobAlert, utcnow
    from tasks.watch import health
    from tasks.watch.health_alerts import RECENTLY_FINISHED

    cache = cache or health.HealthCache(jobs=HEALTH_JOBS)
    recent = GaugeMetricFamily(
        "raas_job_health", "Health figures of a job's last health.window rollouts", labels=["job_id", "figure"]
    )
    versions = GaugeMetricFamily(
        "raas_job_health_by_version", "Health figures per weight version", labels=["job_id", "version", "figure"]
    )
    active = GaugeMetricFamily("raas_job_alert_active", "1 while a health alert is active", labels=["job_id", "alert"])
    with session_scope(db_url) as s:
        since = utcnow() - RECENTLY_FINISHED
        jobs = s.scalars(
            select(Job)
            .where(or_(Job.finished_at.is_(None), Job.finished_at >= since))
            .order_by(Job.created_at.desc())
            .limit(HEALTH_JOBS)
        ).all()
        for job in jobs:
            samples = cache.samples(s, job.id)
            window = JobConfig.load(job.config).health.window
            _add_figures(recent, [job.id], health.figures(samples[-window:]))
            for version, figures in health.by_weight_version(samples).items():
                _add_figures(versions, [job.id, version], figures)
            for name in s.scalars(
                select(JobAlert.name).where(JobAlert.job_id == job.id, JobAlert.cleared_at.is_(None))
            ):
                active.add_metric([job.id, name], 1)
    yield recent
    yield versions
    yield active


def _add_figures(family: GaugeMetricFamily, labels: list[str], figures: Any) -> None:
    for name in HEALTH_FIGURES:
        value = getattr(figures, name)
        if value is not None:
            family.add_metric([*labels, name], float(value))


def render(db_url: str, celery: Any, health_cache: Any = None) -> bytes:
    """The Prometheus text exposition."""
    registry = CollectorRegistry()
    registry.register(RaasCollector(db_url, celery, health_cache))
    return generate_latest(registry)
