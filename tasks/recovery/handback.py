"""Hand a node's rollouts to nodes that can finish them: nothing finished is redone.

A rollout waiting for (or in) EVAL has its artifact and token arrays stored, and grading
starts from a fresh sandbox (`tasks.sandboxing.grading`): any node with a live EVAL pool can grade it.
So when its node cannot (its EVAL queue has no consumer, the node died or drains), it moves
to a live node's EVAL queue in the same attempt: no turn is generated again. A rollout before
or in RUN needs the sandbox on its node; when that node cannot go on, it gets a new attempt
from INIT, which only nodes with live RUN and EVAL pools consume (`tasks.recovery.drain.InitGate`).

Every move is one conditional UPDATE fenced on what the caller observed (the lease it holds,
or attempt + status + node of a queued row), so racing reapers, a draining pool and its
supervisor move a row once. The outbox mark is set with it (see `lifecycle.advance`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import func, or_, select, update

from core.db import session_scope
from core.models import Rollout, Status, utcnow
from core.settings import Settings
from tasks.writes import lifecycle, terminal
from tasks.recovery import nodes
from tasks.sandboxing import sandboxes
from tasks.broker.config import stage_queue
from tasks.broker.publish import publish
from tasks.writes.db_retry import retrying

log = logging.getLogger(__name__)
ACTIVE = ("init", "run", "eval")
LIVE_CACHE_SECONDS = 1.0


def live_queues(settings: Settings) -> set[str]:
    """Queues with a consumer that beat recently (`nodes.fresh_seconds`), read now."""
    fresh = nodes.fresh_seconds(settings.heartbeat_interval, settings.node_timeout)
    return nodes.live_queues(settings.db_url, fresh)


class LiveQueues:
    """`live_queues` as a worker process last read it, for a second (a part of the worker:
    its RUN's hand-ons and INIT's gate ask after every task)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._read: tuple[float, set[str]] | None = None  # (when, queues)

    def read(self, cached: bool = True) -> set[str]:
        """The live queues, read anew unless `cached` and read within `LIVE_CACHE_SECONDS`."""
        now, hit = time.monotonic(), self._read
        if cached and hit and now - hit[0] < LIVE_CACHE_SECONDS:
            return hit[1]
        queues = live_queues(self.settings)
        self._read = (now, queues)
        return queues


def eval_node(settings: Settings, exclude: str | None = None, live: set[str] | None = None) -> str | None:
    """A node whose EVAL queue has a live consumer (this node first unless `exclude`d, then
    the one with the fewest rollouts waiting for EVAL); None when there is none. `live`: the
    live queues as the caller read them (else read now)."""
    live = live_queues(settings) if live is None else live
    candidates = sorted(q.partition(".")[2] for q in live if q.startswith("eval."))
    candidates = [n for n in candidates if n and n != exclude]
    if settings.node in candidates:
        return settings.node
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    with session_scope(settings.db_url) as s:
        waiting = dict(
            s.execute(
                select(Rollout.node, func.count())
                .where(Rollout.status == "eval", Rollout.node.in_(candidates))
                .group_by(Rollout.node)
            ).all()
        )
    return min(candidates, key=lambda n: (waiting.get(n, 0), n))


@retrying
def move_eval(
    db_url: str, rollout_id: str, fence: dict[str, Any], to_node: str, why: str, counted: bool = False
) -> bool:
    """Queue an EVAL-ready rollout for EVAL on `to_node` in the same attempt (its grading
    sandbox is forgotten: the caller releases it where it lives). `counted`: the move stands
    for a lost EVAL and uses the attempt's `max_resumes` budget; a node that drains or lost
    its pool is not the rollout's fault and does not."""
    cond = [Rollout.id == rollout_id, Rollout.status == "eval", *lifecycle.fenced(fence)]
    now = utcnow()
    with session_scope(db_url) as s:
        row = s.execute(select(Rollout.attempt, Rollout.node, Rollout.resumes).where(*cond)).one_or_none()
        if row is None:
            return False
        entry = {
            "attempt": row.attempt,
            "stage": "eval",
            "from_turn": None,
            "error": why[:4000],
            "at": now.isoformat(),
            "from_node": row.node,
            "to_node": to_node,
            **({} if counted else {"moved": True}),
        }
        return (
            s.execute(
                update(Rollout)
                .where(*cond, Rollout.attempt == row.attempt)
                .values(
                    node=to_node,
                    lease_owner=None,
                    heartbeat_at=None,
                    stage_started_at=None,
                    queued_at=now,
                    outbox_at=now,
                    sandbox=None,
                    resumes=[*(row.resumes or []), entry],
                ),
                execution_options={"synchronize_session": False},
            ).rowcount
            == 1
        )


def hand_back(settings: Settings, celery: Any, row: Any, why: str, counted: bool = False) -> str | None:
    """Send one rollout (id, attempt, status, node, lease_owner, sandbox as observed) where it
    can go on: EVAL-ready to a live node's EVAL (or back to its own EVAL queue, unleased, when
    no node has one: a reaper moves it once one appears), the rest to INIT as a new attempt.
    Returns where it went ("eval.<node>", "init"), None when the fence failed."""
    fence = {"attempt": row.attempt, "status": row.status, "node": row.node, "lease_owner": row.lease_owner}
    db = settings.db_url
    if row.status == "eval":
        target = eval_node(settings, exclude=row.node) or row.node
        if target == row.node and row.lease_owner is None:
            return None  # queued where it is, and nowhere better: leave it
        if not move_eval(db, row.id, fence, target, why, counted):
            return None
        _release_here(settings, row.sandbox)
        publish(celery, "eval", row.id, row.attempt, target)  # the mark covers a failure
        lifecycle.clear_mark(db, row.id, row.attempt, "eval")
        log.warning(
            "rollout %s: %s; EVAL moved to %s (attempt %s kept)", row.id, why, stage_queue("eval", target), row.attempt
        )
        return stage_queue("eval", target)
    if row.attempt >= settings.max_attempts:
        from core.models import Outcome

        if not terminal.finish(db, row.id, Status.FAILED, Outcome.INFRA_ERROR.value, fence=fence, error=why):
            return None
        _release_here(settings, row.sandbox)
        return "failed"
    new = lifecycle.retry(db, row.id, expect_lease=row.lease_owner, fence=fence, error=why)
    if new is None:
        return None
    _release_here(settings, row.sandbox)
    publish(celery, "init", row.id, new)
    lifecycle.clear_mark(db, row.id, new, Status.PENDING.value)
    log.warning("rollout %s: %s; restarted from INIT (attempt %s)", row.id, why, new)
    return "init"


def _release_here(settings: Settings, handle: dict[str, Any] | None) -> None:
    """Stop a sandbox if it lives on this node (another node's reaper stops its own)."""
    if handle and handle.get("node", settings.node) == settings.node:
        sandboxes.release(handle)


def _rows(settings: Settings, *where: Any) -> list[Any]:
    with session_scope(settings.db_url) as s:
        return s.execute(
            select(
                Rollout.id, Rollout.attempt, Rollout.status, Rollout.node, Rollout.lease_owner, Rollout.sandbox
            ).where(Rollout.status.in_(ACTIVE), *where)
        ).all()


def hand_back_leases(settings: Settings, celery: Any, leases: list[str], why: str) -> int:
    """What a draining pool still holds at its deadline (its leases, released here)."""
    if not leases:
        return 0
    rows = _rows(settings, Rollout.lease_owner.in_(leases))
    return sum(hand_back(settings, celery, r, why) is not None for r in rows)


def hand_back_queued(settings: Settings, celery: Any, stage: str, why: str, rollout_id: str | None = None) -> int:
    """Rollouts queued for `stage` on this node that it will not take (all, or one)."""
    where = [Rollout.status == stage, Rollout.node == settings.node, Rollout.lease_owner.is_(None)]
    if rollout_id is not None:
        where.append(Rollout.id == rollout_id)
    return sum(hand_back(settings, celery, r, why) is not None for r in _rows(settings, *where))


def hand_back_node(settings: Settings, celery: Any) -> int:
    """After every pool of this node exited: whatever is still queued here or leased by one
    of its processes goes to nodes that can finish it."""
    node = settings.node
    rows = _rows(
        settings, Rollout.node == node, or_(Rollout.lease_owner.is_(None), Rollout.lease_owner.like(f"{node}/%"))
    )
    return sum(hand_back(settings, celery, r, f"{r.status}: node {node} drained") is not None for r in rows)
