"""Node and queue-consumer liveness rows: who is alive to serve a node's queues.

A rollout's RUN and EVAL go to queues of the node that started its sandbox, so a node that
dies (or whose RUN/EVAL pool dies with nobody to restart it) strands whatever waits in those
queues: re-publishing only puts the messages back where nobody reads them. Each node's reaper
beats its `nodes` row every pass; each worker process beats its `queue_consumers` row (and
its node's row) from a thread. The reaper reads them back: a node whose row is stale for
`node_timeout` is dead, and a queue of a known node without a fresh consumer is abandoned.
Nodes that never wrote a row are not judged (a process older than these tables).
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from datetime import timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from core.db import get_engine, session_scope
from core.models import Node, QueueConsumer, utcnow

log = logging.getLogger(__name__)
PRUNE_AFTER = 10  # consumer rows stale for this many node timeouts are deleted


def beat_node(db_url: str, name: str, started: bool = False) -> None:
    """Say node `name` is alive now (`started`: its reaper finished its start-up pass)."""
    now = utcnow()
    values = {"beat_at": now, **({"started_at": now} if started else {})}
    with get_engine(db_url).begin() as conn:  # Core: a beat needs none of the ORM's bookkeeping
        if conn.execute(update(Node).where(Node.name == name).values(**values)).rowcount:
            return
    try:
        with session_scope(db_url) as s:
            s.add(Node(name=name, **values))
    except IntegrityError:  # another process of the node inserted it first
        with session_scope(db_url) as s:
            s.execute(update(Node).where(Node.name == name).values(**values))


def dead_nodes(db_url: str, timeout: float, exclude: str | None = None) -> list[str]:
    """Nodes whose row went stale for `timeout` seconds (never `exclude`, the caller's)."""
    cutoff = utcnow() - timedelta(seconds=timeout)
    with session_scope(db_url) as s:
        names = s.scalars(select(Node.name).where(Node.beat_at < cutoff)).all()
    return sorted(n for n in names if n != exclude)


def known_nodes(db_url: str) -> set[str]:
    """Every node that ever wrote its row."""
    with session_scope(db_url) as s:
        return set(s.scalars(select(Node.name)).all())


def live_queues(db_url: str, timeout: float) -> set[str]:
    """Queues with at least one consumer that beat within `timeout` seconds."""
    cutoff = utcnow() - timedelta(seconds=timeout)
    with session_scope(db_url) as s:
        return set(s.scalars(select(QueueConsumer.queue).where(QueueConsumer.beat_at >= cutoff).distinct()).all())


def prune_consumers(db_url: str, timeout: float) -> int:
    """Delete consumer rows of processes long gone (a stale row and no row mean the same)."""
    cutoff = utcnow() - timedelta(seconds=timeout * PRUNE_AFTER)
    with session_scope(db_url) as s:
        return s.execute(delete(QueueConsumer).where(QueueConsumer.beat_at < cutoff)).rowcount


class ConsumerBeat:
    """The `queue_consumers` row of this worker process, beaten from a daemon thread.

    The thread lives exactly as long as the process: a consumer that dies ends the process
    (non-zero, see `tasks.worker`), so a fresh row means someone is there to read the queue.
    """

    def __init__(self, db_url: str, node: str, queue: str, interval: float) -> None:
        self.db_url = db_url
        self.node = node
        self.queue = queue
        self.interval = interval
        self.id = f"{node}/{queue}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()

    def start(self) -> None:
        """Insert the row and start beating it."""
        with session_scope(self.db_url) as s:
            s.add(QueueConsumer(id=self.id, node=self.node, queue=self.queue, pid=os.getpid()))
        beat_node(self.db_url, self.node)
        threading.Thread(target=self._loop, name="raas-consumer-beat", daemon=True).start()

    def beat_once(self) -> None:
        """Refresh the consumer row and the node row (a DB blip is retried next round)."""
        try:
            with get_engine(self.db_url).begin() as conn:
                conn.execute(update(QueueConsumer).where(QueueConsumer.id == self.id).values(beat_at=utcnow()))
            beat_node(self.db_url, self.node)
        except Exception:
            log.exception("consumer beat failed")

    def stop(self) -> None:
        """Stop beating and delete the row: this process no longer reads the queue."""
        self._stop.set()
        try:
            with session_scope(self.db_url) as s:
                s.execute(delete(QueueConsumer).where(QueueConsumer.id == self.id))
        except Exception:  # the row goes stale instead: same meaning
            log.exception("removing consumer row %s failed", self.id)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat_once()


def forget_consumers(db_url: str, node: str, pid: int) -> int:
    """Delete the consumer rows of a pool process its supervisor saw exit (no reader now)."""
    with session_scope(db_url) as s:
        return s.execute(delete(QueueConsumer).where(QueueConsumer.node == node, QueueConsumer.pid == pid)).rowcount


def mark_gone(db_url: str, name: str) -> None:
    """A node that drained and exited: its row reads as long dead (other reapers move what is
    left on it at once) and its consumer rows go."""
    with session_scope(db_url) as s:
        s.execute(update(Node).where(Node.name == name).values(beat_at=utcnow() - timedelta(days=1)))
        s.execute(delete(QueueConsumer).where(QueueConsumer.node == name))


def consumer_beat_interval(heartbeat_interval: float, node_timeout: float) -> float:
    """How often a pool beats its consumer row: four beats per `node_timeout`."""
    return max(0.2, min(heartbeat_interval * 5, node_timeout / 4))


def fresh_seconds(heartbeat_interval: float, node_timeout: float) -> float:
    """How recent a consumer row must be for a routing decision (three missed beats): a
    pool that was killed stops counting well before `node_timeout` judges its node."""
    return 3 * consumer_beat_interval(heartbeat_interval, node_timeout)
