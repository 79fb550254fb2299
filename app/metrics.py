"""Prometheus metrics, computed at scrape time from the two sources of truth.

Queue depths come from the broker (including the unrouted queue nobody consumes: a value
above zero is a routing bug); rollout counts and stage-duration histograms come from the
database, so every gateway reports the same numbers no matter which worker did the work.
"""
from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from sqlalchemy import case, func, select

from app.db import session_scope
from app.models import Rollout
from tasks.config import UNROUTED_QUEUE

log = logging.getLogger(__name__)
BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


def queue_depths(celery: Any, queues: list[str]) -> dict[str, int]:
    """Messages waiting in each queue (passive declare: never creates anything)."""
    depths: dict[str, int] = {}
    with celery.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in queues:
            try:
                depths[queue] = channel.queue_declare(queue=queue, passive=True).message_count
            except Exception:  # a queue nobody declared yet is simply empty
                depths[queue] = 0
                channel = conn.channel() if conn.connected else conn.default_channel
    return depths


def known_queues(db_url: str) -> list[str]:
    """init, the unrouted queue, and run/eval queues of every node that ever ran INIT."""
    with session_scope(db_url) as s:
        nodes = s.scalars(select(Rollout.node).where(Rollout.node.is_not(None)).distinct()).all()
    return ["init", UNROUTED_QUEUE] + [f"{stage}.{n}" for n in sorted(nodes)
                                       for stage in ("run", "eval")]


class RaasCollector:
    """Collects raas metrics on every scrape."""

    def __init__(self, db_url: str, celery: Any) -> None:
        self.db_url = db_url
        self.celery = celery

    def collect(self):
        """Yield the metric families."""
        depth = GaugeMetricFamily("raas_queue_depth", "Messages waiting per queue", labels=["queue"])
        try:
            for queue, n in queue_depths(self.celery, known_queues(self.db_url)).items():
                depth.add_metric([queue], n)
        except Exception:
            log.exception("reading queue depths failed")
        yield depth
        yield from self._rollouts()

    def _rollouts(self):
        by_status = GaugeMetricFamily("raas_rollouts", "Rollouts by status and outcome",
                                      labels=["status", "outcome"])
        with session_scope(self.db_url) as s:
            for status, outcome, n in s.execute(
                    select(Rollout.status, Rollout.outcome, func.count())
                    .group_by(Rollout.status, Rollout.outcome)):
                by_status.add_metric([status, outcome or ""], n)
            yield by_status
            for stage in ("init", "run", "eval"):
                yield self._histogram(s, stage)

    def _histogram(self, s: Any, stage: str) -> HistogramMetricFamily:
        col = getattr(Rollout, f"{stage}_seconds")
        cols = [func.sum(case((col <= b, 1), else_=0)) for b in BUCKETS]
        row = s.execute(select(func.count(col), func.coalesce(func.sum(col), 0.0), *cols)).one()
        count, total, *cum = row
        buckets = [(str(b), int(c or 0)) for b, c in zip(BUCKETS, cum)] + [("+Inf", int(count))]
        hist = HistogramMetricFamily(f"raas_stage_{stage}_seconds",
                                     f"Seconds spent in {stage} (queue time excluded)")
        hist.add_metric([], buckets, float(total))
        return hist


def render(db_url: str, celery: Any) -> bytes:
    """The Prometheus text exposition."""
    registry = CollectorRegistry()
    registry.register(RaasCollector(db_url, celery))
    return generate_latest(registry)
