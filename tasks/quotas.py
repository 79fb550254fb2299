"""What one request and one tenant may cost: operator caps checked at submission.

A job above `max_rollouts_per_job` is refused outright (400: it can never be accepted); a job
that would take its owner above `max_in_flight_per_owner` unfinished rollouts is refused for
now (429: it can be retried when earlier work finishes or is cancelled). In-flight is counted
from the jobs table (total minus finished of every unfinished job), under a per-owner lock on
PostgreSQL, so two concurrent submissions cannot both slip under the cap.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from core.settings import Settings
from core.errors import InvalidRequest, QuotaExceeded
from core.models import Job


def check_job_size(settings: Settings, n_instances: int, n_samples: int) -> int:
    """The job's rollout count, or a 400 naming the cap."""
    n = n_instances * n_samples
    cap = settings.max_rollouts_per_job
    if n > cap:
        raise InvalidRequest(
            f"{n_instances} instances x n_samples {n_samples} = {n} rollouts is above this "
            f"service's cap of {cap} rollouts per job (max_rollouts_per_job); split the batch",
            field="instances",
            cap="max_rollouts_per_job",
            limit=cap,
            requested=n,
        )
    return n


def in_flight(s: Session, owner: str) -> int:
    """Unfinished rollouts of `owner` (queued or running)."""
    return int(
        s.scalar(
            select(func.coalesce(func.sum(Job.n_instances * Job.n_samples - Job.finished_count), 0)).where(
                Job.owner == owner, Job.finished_at.is_(None)
            )
        )
        or 0
    )


def reserve_in_flight(s: Session, settings: Settings, owner: str, n: int) -> None:
    """Admit `n` more rollouts for `owner` in this transaction, or a 429 naming the cap."""
    if s.get_bind().dialect.name == "postgresql":  # SQLite's writers are serialized already
        key = int.from_bytes(hashlib.blake2b(owner.encode(), digest_size=8).digest(), "big", signed=True)
        s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
    busy = in_flight(s, owner)
    cap = settings.max_in_flight_per_owner
    if busy + n > cap:
        raise QuotaExceeded(
            f"owner {owner!r} has {busy} unfinished rollouts; {n} more would be above the cap "
            f"of {cap} (max_in_flight_per_owner); retry when some have finished",
            cap="max_in_flight_per_owner",
            limit=cap,
            in_flight=busy,
            requested=n,
        )
