"""Idempotent submissions: a repeated key is the same job only if it is the same request.

A trainer that lost the 202 of a submission (gateway restart, timeout) sends it again with
the same `idempotency_key` and must get the job it already made, with the rollout ids in the
order of the request (instances x samples), exactly as the first answer listed them. Reusing
a key for another request is a bug on the caller's side: it gets a 409 naming what differs,
never the old job silently. Each job stores a digest per request field for that comparison.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.schemas import JobAccepted, JobCreate
from core.db import session_scope
from core.errors import Conflict
from core.models import Job, Rollout
from core.settings import Settings

DIGEST_EXCLUDE = {"idempotency_key"}


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def request_digest(req: JobCreate) -> dict[str, str]:
    """One hash per request field (defaults filled in, so an omitted default equals it)."""
    body = req.model_dump(mode="json", exclude=DIGEST_EXCLUDE)
    return {name: _digest(value) for name, value in sorted(body.items())}


def replay(settings: Settings, owner: str, req: JobCreate) -> JobAccepted | None:
    """The job this owner already submitted under `req.idempotency_key`, or None.

    Raises Conflict naming the differing fields when the key was used for another request.
    """
    key = req.idempotency_key
    if not key:
        return None
    with session_scope(settings.db_url) as s:
        job = s.scalar(select(Job).where(Job.owner == owner, Job.idempotency_key == key))
        if job is None:
            return None
        if job.request_digest is not None:
            differs = [f for f, h in request_digest(req).items() if job.request_digest.get(f) != h]
            if differs:
                raise Conflict(_difference(s, job, req, differs), field=differs[0], job_id=job.id, fields=differs)
        ids = _ids_in_request_order(s, job.id, req)
        return JobAccepted.build(job_id=job.id, rollout_ids=ids, created=False)


def _ids_in_request_order(s: Session, job_id: str, req: JobCreate) -> list[str]:
    """The job's rollout ids in the order `create_job` made them: instances in request order,
    samples 0..n-1 each (the request is the same one, so its order is the original order)."""
    by_key = {
        (i, k): rid
        for rid, i, k in s.execute(
            select(Rollout.id, Rollout.instance_id, Rollout.sample_index).where(Rollout.job_id == job_id)
        )
    }
    order = [(inst.instance_id, k) for inst in req.instances for k in range(req.n_samples + req.spare)]
    if set(order) != set(by_key):  # a job from before request digests, with another body
        return [by_key[k] for k in sorted(by_key)]
    return [by_key[k] for k in order]


def _difference(s: Session, job: Job, req: JobCreate, fields: list[str]) -> str:
    """What differs, as precisely as the stored job allows."""
    parts = []
    for name in fields:
        if name == "agent":
            parts.append(f"agent {req.agent!r} (the job has {job.agent!r})")
        elif name == "n_samples":
            parts.append(f"n_samples {req.n_samples} (the job has {job.group_size or job.n_samples})")
        elif name == "instances":
            parts.append(_instances_difference(s, job, req))
        else:
            parts.append(name)
    return (
        f"idempotency_key {req.idempotency_key!r} was used for another submission "
        f"(job {job.id}); this one differs in: {'; '.join(parts)}. Use a new key for a "
        f"new job, or send the same body to get the same job back"
    )


def _instances_difference(s: Session, job: Job, req: JobCreate) -> str:
    """Which instance differs: one missing or added, changed data, or the order."""
    stored = dict(
        s.execute(
            select(Rollout.instance_id, Rollout.instance).where(Rollout.job_id == job.id, Rollout.sample_index == 0)
        ).all()
    )
    sent = {inst.instance_id: inst.data for inst in req.instances}
    added = [i for i in sent if i not in stored]
    missing = [i for i in stored if i not in sent]
    if added or missing:
        return (
            f"instances ({len(sent)} sent, the job has {len(stored)}"
            + (f"; new: {', '.join(map(repr, added[:3]))}" if added else "")
            + (f"; missing: {', '.join(map(repr, missing[:3]))}" if missing else "")
            + ")"
        )
    changed = [i for i in sent if _digest(sent[i]) != _digest(stored[i])]
    if changed:
        return f"instances (data of {', '.join(map(repr, changed[:3]))})"
    return "instances (same ids and data in another order)"
