"""Branch a rollout at turn k: m continuations of it, each a rollout of its own (issue 38).

A branch keeps the parent's turns 0..k and samples on from turn k+1. Nothing of the parent is
generated again: at creation the parent's logged turns 0..k (its current attempt) are copied
into each branch's turn log as attempt 0, "inherited", and the branch's RUN treats them as an
earlier attempt whose sandbox was lost (`tasks.recovery.resume.turns_to_resume`): the LLM
session is rebuilt from them token for token (`agents.llm.replay`), their tool calls are
replayed into the branch's freshly INITed sandbox with divergence detection
(`agents.loop_replay`), so its workspace is the parent's as it was after turn k, and the loop
goes on live. EVAL is the pipeline's, unchanged: each branch is graded on its own artifact.

Where branches live: the m branches of one request are one child job (the parent's agent and
config, one instance, `n_samples` m). A trainer collecting groups wants exactly that: the
branches of one state are one group (job + instance), waited for and collected like any
job's, and the parent's job keeps its counts, groups and completion as they were (a branch
added to it would reopen a finished job and join a group it was not sampled with). Each
branch row names its parent and turn (`parent_rollout_id`, `branch_turn`); the child job's
`labels` say the same. The child job has no callback URL: the parent's job was told about
its own rollouts, the trainer that asked for branches collects them (`RaasClient.tree`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agents.registry import get_handler
from app.jobs import rollout_view
from app.rollouts import owned_rollout
from app.schemas import BranchCreate, BranchesAccepted, BranchList
from core.db import session_scope
from core.errors import Conflict, InvalidRequest
from core.models import TERMINAL_VALUES, Job, Rollout, Turn, new_id
from core.settings import Settings
from tasks import quotas
from tasks.broker import outbox
from tasks.recovery.resume import INHERITED_ATTEMPT
from tasks.writes import lifecycle

# The turn columns a branch inherits as they were logged (its own id, rollout and attempt).
COPIED = tuple(c.name for c in Turn.__table__.columns if c.name not in ("id", "rollout_id", "attempt"))


def create_branches(settings: Settings, parent_id: str, req: BranchCreate, owner: str, celery: Any) -> BranchesAccepted:
    """Validate the request against the parent's turn log, then commit the child job, its
    branches and their inherited turns in one transaction (published after the answer by the
    gateway's outbox thread, as a submission is). Idempotent on `req.idempotency_key`."""
    digest = _digest(parent_id, req)
    existing = _replay(settings, owner, req, digest)
    if existing is not None:
        return existing
    n = quotas.check_job_size(settings, 1, req.n)
    try:
        with session_scope(settings.db_url) as s:
            parent, job = owned_rollout(s, parent_id, owner)
            turns = _prefix(s, parent, job, req.turn)
            quotas.reserve_in_flight(s, settings, owner, n)
            child = Job(
                owner=owner,
                agent=job.agent,
                config={**job.config, "labels": {"branch_of": parent.id, "branch_turn": str(req.turn)}},
                idempotency_key=req.idempotency_key,
                request_digest=digest if req.idempotency_key else None,
                n_instances=1,
                n_samples=req.n,
                priority=job.priority,
            )
            s.add(child)
            s.flush()
            now = lifecycle.utcnow()
            rows = [
                {
                    "id": new_id(),
                    "job_id": child.id,
                    "instance_id": parent.instance_id,
                    "instance": parent.instance,
                    "sample_index": k,
                    "parent_rollout_id": parent.id,
                    "branch_turn": req.turn,
                    "queued_at": now,
                    "created_at": now,
                    "outbox_at": now,
                }
                for k in range(req.n)
            ]
            s.execute(insert(Rollout), rows)
            inherited = [
                {**{c: getattr(t, c) for c in COPIED}, "rollout_id": row["id"], "attempt": INHERITED_ATTEMPT}
                for row in rows
                for t in turns
            ]
            s.execute(insert(Turn), inherited)
            child_id = child.id
    except IntegrityError:  # a concurrent request with the same key committed first
        existing = _replay(settings, owner, req, digest)
        if existing is None:
            raise
        return existing
    ids = [row["id"] for row in rows]
    celery.raas_parts.get(outbox.OutboxPublisher).submit(ids)  # the gateway's (`app.factory`)
    return BranchesAccepted.build(
        job_id=child_id, rollout_ids=ids, parent_rollout_id=parent_id, branch_turn=req.turn, created=True
    )


def _prefix(s: Session, parent: Rollout, job: Job, k: int) -> list[Turn]:
    """The parent's logged turns 0..k of its current attempt, or the 4xx naming why there
    is no such prefix to branch from."""
    handler = get_handler(job.agent)
    if not handler.resumable:
        raise InvalidRequest(
            f"agent {job.agent!r} cannot be branched: its RUN is not the shared agent loop, "
            "so there are no logged tool calls to rebuild a sandbox from",
            field="turn",
        )
    logged = list(
        s.scalars(
            select(Turn).where(Turn.rollout_id == parent.id, Turn.attempt == parent.attempt).order_by(Turn.index)
        ).all()
    )
    if k >= len(logged):
        have = f"turns 0..{len(logged) - 1}" if logged else "no turns"
        if parent.status in TERMINAL_VALUES:
            raise InvalidRequest(
                f"turn {k} is out of range: rollout {parent.id!r} ended ({parent.status}) having logged {have}",
                field="turn",
                logged_turns=len(logged),
            )
        raise Conflict(
            f"rollout {parent.id!r} ({parent.status}) has logged {have} of attempt {parent.attempt} "
            f"so far: turn {k} is not logged yet; ask again once it is",
            field="turn",
            logged_turns=len(logged),
        )
    prefix = logged[: k + 1]
    if [t.index for t in prefix] != list(range(k + 1)):
        raise Conflict(f"rollout {parent.id!r}: its turn log of attempt {parent.attempt} has gaps before turn {k}")
    state = prefix[-1].loop_state
    if not state:
        raise InvalidRequest(
            f"turn {k} of rollout {parent.id!r} was logged without the loop's state: it cannot be continued",
            field="turn",
        )
    if state.get("finish_reason"):
        raise InvalidRequest(
            f"turn {k} ended the episode of rollout {parent.id!r} ({state['finish_reason']}): there is "
            f"nothing to continue after it; branch at an earlier turn" + (f" (0..{k - 1})" if k else ""),
            field="turn",
        )
    return prefix


def list_branches(db_url: str, parent_id: str, owner: str) -> BranchList:
    """Every branch of one of the owner's rollouts, by turn and creation, without turns."""
    with session_scope(db_url) as s:
        owned_rollout(s, parent_id, owner)
        rows = s.scalars(
            select(Rollout)
            .join(Job, Job.id == Rollout.job_id)
            .where(Rollout.parent_rollout_id == parent_id, Job.owner == owner)
            .order_by(Rollout.branch_turn, Rollout.created_at, Rollout.job_id, Rollout.sample_index)
        ).all()
        return BranchList.build(parent_rollout_id=parent_id, branches=[rollout_view(r) for r in rows])


def _digest(parent_id: str, req: BranchCreate) -> dict[str, str]:
    """One hash per request field (`app.idempotency`'s shape: a reused key names what differs)."""
    body = {"parent_rollout_id": parent_id, **req.model_dump(mode="json", exclude={"idempotency_key"})}
    return {
        name: hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]
        for name, value in sorted(body.items())
    }


def _replay(settings: Settings, owner: str, req: BranchCreate, digest: dict[str, str]) -> BranchesAccepted | None:
    """The branches this owner already asked for under `req.idempotency_key`, or None; a key
    used for another request (or a submission) is a 409 naming what differs."""
    if not req.idempotency_key:
        return None
    with session_scope(settings.db_url) as s:
        job = s.scalar(select(Job).where(Job.owner == owner, Job.idempotency_key == req.idempotency_key))
        if job is None:
            return None
        differs = [f for f, h in digest.items() if (job.request_digest or {}).get(f) != h]
        if differs:
            raise Conflict(
                f"idempotency_key {req.idempotency_key!r} was used for another request "
                f"(differs in {', '.join(differs)})",
                field=differs[0],
                job_id=job.id,
            )
        rows = s.execute(
            select(Rollout.id, Rollout.parent_rollout_id, Rollout.branch_turn)
            .where(Rollout.job_id == job.id)
            .order_by(Rollout.sample_index)
        ).all()
        return BranchesAccepted.build(
            job_id=job.id,
            rollout_ids=[r.id for r in rows],
            parent_rollout_id=rows[0].parent_rollout_id,
            branch_turn=rows[0].branch_turn,
            created=False,
        )
