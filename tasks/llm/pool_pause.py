"""Pool-wide pause at a turn boundary: stop new generations on an owner's servers and wait
until none is in flight; resume, optionally with a new weight version.

Pausing sets `paused` on the rows; a session marks its rollout (`Rollout.generating_on`)
before each request in the same statement that reads the server's row under a share lock
(`RegisteredPool.begin_generation`), so every request either saw the pause and waits, or holds
a mark this module waits for (the pause's UPDATE waits for the mark's commit). The mark's
clear after the request is queued with the process's turn-log batch (`tasks.writes.turn_log`): a
pause may wait a few milliseconds longer for it, never less. In-flight
generations finish normally: nothing is aborted. A mark of a worker that died stops counting
when its lease's heartbeat is older than `lease_timeout` (the request died with it).
Waiting rollouts keep their slot and keep beating; the wait is not charged to their deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select, update

from core.db import session_scope
from core.errors import InvalidRequest, NotFound, PauseTimeout
from core.models import Job, LLMServer, Rollout, utcnow

POLL_SECONDS = 0.05


@dataclass
class PoolServer:
    """One server of a pause: who it is, and how long its in-flight generations took to end."""

    id: str
    url: str
    backend: str
    model: str | None
    generating_at_pause: int = 0
    paused_seconds: float = 0.0


def target_servers(db_url: str, owner: str, ids: list[str] | None) -> list[PoolServer]:
    """`owner`'s servers named by `ids` (all of them when None); an unknown id is a 404."""
    with session_scope(db_url) as s:
        rows = s.scalars(select(LLMServer).where(LLMServer.owner == owner).order_by(LLMServer.created_at)).all()
        servers = [PoolServer(r.id, r.url, r.backend or "vllm", r.model) for r in rows]
    if ids is not None:
        known = {p.id: p for p in servers}
        missing = [i for i in ids if i not in known]
        if missing:
            raise NotFound(f"llm server {missing[0]!r} not found", field="servers")
        servers = [known[i] for i in dict.fromkeys(ids)]
    if not servers:
        raise InvalidRequest("servers: the caller's pool has no registered server", field="servers")
    return servers


def generating(db_url: str, owner: str, urls: list[str], lease_timeout: float) -> dict[str, int]:
    """Requests in flight per server url: marked rollouts of `owner` whose lease still beats."""
    cutoff = utcnow() - timedelta(seconds=lease_timeout)
    with session_scope(db_url) as s:
        rows = s.execute(
            select(Rollout.generating_on, func.count())
            .join(Job, Job.id == Rollout.job_id)
            .where(
                Job.owner == owner,
                Rollout.generating_on.in_(urls),
                Rollout.lease_owner.is_not(None),
                Rollout.heartbeat_at > cutoff,
            )
            .group_by(Rollout.generating_on)
        ).all()
    return {url: int(n) for url, n in rows}


def set_paused(
    db_url: str, owner: str, ids: list[str], paused: bool, weight_version: str | None = None, model: str | None = None
) -> None:
    """Set `paused` (and the new version / served model, if given) on these rows at once."""
    values: dict[str, object] = {"paused": paused}
    if weight_version is not None:
        values["weight_version"] = weight_version
    if model is not None:
        values["model"] = model
    with session_scope(db_url) as s:
        s.execute(update(LLMServer).where(LLMServer.owner == owner, LLMServer.id.in_(ids)).values(**values))


def pause(
    db_url: str, owner: str, ids: list[str] | None = None, timeout: float = 300.0, lease_timeout: float = 30.0
) -> list[PoolServer]:
    """Pause the servers, then wait until none has a generation in flight.

    Returns the servers with the seconds each took to drain. On `timeout` raises PauseTimeout
    naming what is still in flight; the servers stay paused (resume, or pause again to wait
    longer).
    """
    servers = target_servers(db_url, owner, ids)
    set_paused(db_url, owner, [p.id for p in servers], True)
    started = time.monotonic()
    urls = [p.url for p in servers]
    first = generating(db_url, owner, urls, lease_timeout)
    for server in servers:
        server.generating_at_pause = first.get(server.url, 0)
    waiting = {p.url: p for p in servers}
    counts = first
    while True:
        elapsed = time.monotonic() - started
        for url in [u for u in waiting if not counts.get(u)]:
            waiting.pop(url).paused_seconds = round(elapsed, 4)
        if not waiting:
            return servers
        if elapsed > timeout:
            raise PauseTimeout(
                f"generations still in flight after {timeout:g} s; the servers stay paused: "
                "POST /v1/llm/resume to serve again, or POST /v1/llm/pause to wait longer",
                in_flight={u: counts.get(u, 0) for u in waiting},
            )
        time.sleep(POLL_SECONDS)
        counts = generating(db_url, owner, list(waiting), lease_timeout)


def resume(
    db_url: str, owner: str, ids: list[str] | None = None, weight_version: str | None = None, model: str | None = None
) -> list[str]:
    """Unpause the servers (recording the new version from the next turn on); their ids."""
    servers = target_servers(db_url, owner, ids)
    set_paused(db_url, owner, [p.id for p in servers], False, weight_version, model)
    return [p.id for p in servers]
