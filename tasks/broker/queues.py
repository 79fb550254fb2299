"""Broker queue depths, read by the reaper (backlog) and by the gateway's /metrics."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from core.db import session_scope
from core.models import Rollout
from tasks.broker.config import UNROUTED_QUEUE


def queue_depths(celery: Any, queues: list[str]) -> dict[str, int]:
    """Messages waiting in each queue (never creates anything).

    kombu's Redis channel counts with its `_size` (LLEN over the priority lists): a passive
    declare first checks the queue exists with EXISTS, which kombu does not prefix
    under `global_keyprefix`, so with RAAS_BROKER_KEY_PREFIX every queue looked empty (and
    the reaper re-published whole backlogs on every pass).
    """
    depths: dict[str, int] = {}
    with celery.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in queues:
            try:
                size = getattr(channel, "_size", None)
                depths[queue] = (
                    size(queue) if size is not None else channel.queue_declare(queue=queue, passive=True).message_count
                )
            except Exception:  # a queue nobody declared yet is simply empty
                depths[queue] = 0
                channel = conn.channel() if conn.connected else conn.default_channel
    return depths


def known_queues(db_url: str) -> list[str]:
    """init, the unrouted queue, and run/eval queues of every node that ever ran INIT."""
    with session_scope(db_url) as s:
        nodes = s.scalars(select(Rollout.node).where(Rollout.node.is_not(None)).distinct()).all()
    return ["init", UNROUTED_QUEUE] + [f"{stage}.{n}" for n in sorted(nodes) for stage in ("run", "eval")]
